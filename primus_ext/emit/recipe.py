"""The recipe directory of a tuning run, every file written atomically.

- ``overrides.txt``: Hydra overrides, one per line, that reproduce the winner:
  ``primus-ext mode=project $(cat overrides.txt)`` projects it with the same figures;
- ``recipe.yaml``: the full composed config of the winner;
- ``megatron_args.sh``: a torchrun line with Megatron-LM flags for the winner, or with
  ``framework=torchtitan`` ``torchtitan_args.sh``: ``torchrun ... -m torchtitan.train``
  with torchtitan's flags (``frameworks/torchtitan/flags.py``);
- ``report.md``: winner against baseline and reference, top-k, Pareto front, search;
- ``timeline.json``: Chrome trace of the winner's simulated step;
- ``trials.png``: every candidate, tokens/s/GPU against peak memory, winner and baseline;
- ``trials.jsonl``: the journal (written during the search, see tune/journal.py).
"""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Callable, Sequence

from primus_ext.frameworks.megatron.flags import torchrun_script
from primus_ext.emit.overrides import _key_of, recipe_config, spec_overrides
from primus_ext.emit.tune_report import render_report
from primus_ext.tune.space import describe
from primus_ext.util.files import atomic_write_text

log = logging.getLogger("primus_ext.tune")


def _projection_overrides(result, user_overrides: Sequence[str] | None) -> list[str]:
    ovs = spec_overrides(result.best_spec, user_overrides)
    keys = {_key_of(o) for o in ovs}
    s = result.settings
    if s.calibration != "default" and "calibration" not in keys and (
            s.calibration is None or isinstance(s.calibration, str)):
        ovs.append(f"calibration={'null' if s.calibration is None else s.calibration}")
    if s.backend == "hybrid" and s.profile:
        ovs += [o for o in ("backend=profile", f"profile={s.profile}")
                if _key_of(o) not in keys]
    return ovs


def _timeline(result, project_fn: Callable | None) -> dict | None:
    spec, s = result.best_spec, result.settings
    if project_fn is None and s.backend == "hybrid":
        from primus_ext.project.from_profile import project_from_profile
        est = project_from_profile(s.profile, spec, calibration=s.calibration,
                                   record_timeline=True)
    elif project_fn is None:
        from primus_ext.project.estimate import project
        est = project(spec, calibration=s.calibration, record_timeline=True)
    else:
        est = project_fn(spec)
    timeline = getattr(est, "timeline", None)
    if timeline is None:
        return None
    from primus_ext.project.trace import to_chrome_trace
    p = spec.parallel
    return to_chrome_trace(timeline, [f"stage {s} (TP{p.tp} CP{p.cp})" for s in
                                      range(timeline.num_stages)])


def write_recipe(result, out_dir: str | os.PathLike, user_overrides: Sequence[str] | None,
                 project_fn: Callable | None = None) -> dict[str, Path]:
    out = Path(out_dir)
    files: dict[str, Path] = {}
    overrides = _projection_overrides(result, user_overrides)
    files["overrides"] = atomic_write_text(out / "overrides.txt", "\n".join(overrides) + "\n")
    files["recipe"] = atomic_write_text(out / "recipe.yaml", recipe_config(overrides))
    title = (f"{result.best_spec.model.name}: {describe(result.best.point)} "
             f"({result.best.metrics['tokens_per_s_per_gpu']:,.0f} tokens/s/GPU projected)")
    if result.best_spec.framework == "torchtitan":
        from primus_ext.frameworks.torchtitan.flags import script as titan_script
        key, name, text = "torchtitan_args", "torchtitan_args.sh", titan_script(
            result.best_spec, title)
    else:
        key, name, text = "megatron_args", "megatron_args.sh", torchrun_script(
            result.best_spec, title)
    files[key] = atomic_write_text(out / name, text)
    os.chmod(files[key], 0o755)
    trace = _timeline(result, project_fn)
    if trace is not None:
        files["timeline"] = atomic_write_text(out / "timeline.json", json.dumps(trace))
    files["report"] = atomic_write_text(out / "report.md", render_report(result, overrides))
    try:  # a picture must not cost the recipe
        from primus_ext.emit.plots import plot_trials
        files["trials_plot"] = plot_trials(result.trials, out / "trials.png",
                                           winner=result.best, baseline=result.baseline)
    except Exception as exc:  # noqa: BLE001
        log.warning("trials.png not written: %s: %s", type(exc).__name__, exc)
    journal = out / "trials.jsonl"
    if journal.is_file():
        files["trials"] = journal
    return files
