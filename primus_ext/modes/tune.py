"""mode=tune: search the layout space of the composed job and write a recipe directory."""
from __future__ import annotations

import sys

from omegaconf import OmegaConf

from primus_ext.config import tune_spec
from primus_ext.emit.console import gib, print_json, print_table
from primus_ext.tune.run import tune
from primus_ext.tune.settings import TuneSettings
from primus_ext.tune.space import describe


def _task_overrides() -> list[str] | None:
    from hydra.core.hydra_config import HydraConfig

    try:
        return list(HydraConfig.get().overrides.task)
    except ValueError:
        return None


def run(cfg) -> dict:
    spec, unstated = tune_spec(cfg)
    data = OmegaConf.to_container(cfg.tune, resolve=True)
    settings = TuneSettings.from_dict(data, calibration=cfg.get("calibration", "default"),
                                      profile=cfg.get("profile"), unstated=unstated)
    result = tune(spec, settings, overrides=_task_overrides())
    out = result.to_dict()
    if cfg.output == "json":
        print_json(out)
    else:
        print_summary(result)
    if result.interrupted:  # Ctrl-C: the recipe of the best so far is written
        print(f"primus-ext tune: interrupted; resume with tune.resume=true "
              f"tune.out_dir={result.out_dir}", file=sys.stderr)
        sys.exit(130)
    return out


def print_summary(result) -> None:
    best = result.best
    if best is None:
        print("primus-ext tune: no layout fits; see the rejected counts in the journal",
              file=sys.stderr)
        return
    top = result.top(result.settings.top_k)
    rows = []
    for i, t in enumerate(top, 1):
        m = t.metrics
        rows.append((i, describe(t.point), m["step_time_s"],
                     f"{m['tokens_per_s_per_gpu']:,.0f}",
                     f"{m['mfu']:.1%}", f"{gib(m['peak_memory_bytes']):.1f}", t.source))
    st = result.stats
    print_table(f"{result.base_spec.model.name}: top {len(top)} layouts "
                f"({result.strategy}, {st['evaluated']} evaluated, "
                f"{st['seconds']:.1f} s)",
                ["#", "layout", "step s", "tok/s/GPU", "MFU", "mem GiB", "found by"], rows,
                caption=f"space: {result.space['num_legal']:,} legal of "
                        f"{result.space['num_raw']:,}")
    ref = result.reference
    if ref and ref.get("projected"):
        print(f"reference {ref['run_id']} ({ref['layout']}): projected "
              f"{ref['projected']['tokens_per_s_per_gpu']:,.0f} tok/s/GPU, measured "
              f"{ref['measured_tokens_per_s_per_gpu'] or float('nan'):,.0f}; winner gain "
              f"{ref['gain']:+.1%}")
    if result.out_dir:
        print(f"recipe: {result.out_dir}")
