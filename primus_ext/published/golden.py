"""Megatron-LM's functional-test golden values (DGX H100) as RunSpecs (pure).

``tests/data/megatron_golden/h100.json`` (built by ``scripts/golden_dataset.py`` from one
Megatron-LM commit) holds, per functional test, the real ``pretrain_gpt.py`` flags, the
node count of its recipe, the median iteration time after warmup and the allocated peak
of the last rank. ``read_golden`` turns the training cases into ``GoldenCase`` values:
the flags are read by the drop-in's own reader (``frameworks/megatron/args.py``), as a
user's launch line would be, with ``--target-nodes``/``--target-gpus-per-node`` from the
recipe and ``--target-hardware h100``. A case the reader refuses keeps its reason.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_PATH = ROOT / "tests" / "data" / "megatron_golden" / "h100.json"
# Test types that train from scratch or resume training (not inference, RL or
# checkpoint conversion).
TRAINING_TYPES = ("regular", "ckpt-resume")
TRAINING_SCRIPTS = ("pretrain_gpt.py",)
HARDWARE = "h100"


@dataclass(frozen=True, kw_only=True, slots=True)
class GoldenCase:
    case: str
    family: str  # Megatron-LM's test family: gpt, moe, mixtral
    argv: tuple[str, ...]  # the flags as Megatron-LM's CI passes them
    env: tuple[tuple[str, str], ...]
    nodes: int
    gpus_per_node: int
    iteration_time_s: float | None  # median after warmup, as Megatron-LM logs it
    mem_max_allocated_bytes: float | None  # last rank's torch allocated peak
    mem_max_allocated_bytes_early: float | None = None  # the same at the 2nd logged step
    mem_allocated_bytes: float | None = None  # allocated after the last logged step
    launch: object | None  # LaunchArgs, None when the reader refused the line
    error: str | None  # the reader's reason when it refused

    @property
    def spec(self):
        return None if self.launch is None else self.launch.spec

    @property
    def is_moe(self) -> bool:
        return self.spec is not None and bool(self.spec.model.num_moe_experts)

    @property
    def target_argv(self) -> list[str]:
        return list(self.argv) + ["--target-nodes", str(self.nodes),
                                  "--target-gpus-per-node", str(self.gpus_per_node),
                                  "--target-hardware", HARDWARE]


def _parse(argv: list[str]):
    """(LaunchArgs, None) or (None, reason)."""
    import contextlib
    import io

    from primus_ext.frameworks.megatron.args import parse_launch_args
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return parse_launch_args(argv), None
    except SystemExit:  # argparse: a bad choice or a missing flag
        lines = [ln for ln in err.getvalue().splitlines() if ln.strip()]
        return None, lines[-1] if lines else "argument error"
    except ValueError as exc:
        return None, str(exc)


def read_golden(path: str | Path | None = None, *, timed_only: bool = False
                ) -> list[GoldenCase]:
    """The training cases with a stated node count, in file order."""
    data = json.loads(Path(path or DEFAULT_PATH).read_text())
    out = []
    for c in data["cases"]:
        if c.get("script") not in TRAINING_SCRIPTS or c.get("test_type") not in \
                TRAINING_TYPES or not c.get("nodes"):
            continue
        if timed_only and not c.get("median_iteration_time_s"):
            continue
        case = GoldenCase(case=c["case"], family=c["family"], argv=tuple(c["argv"]),
                          env=tuple(sorted(c.get("env", {}).items())), nodes=c["nodes"],
                          gpus_per_node=c["gpus_per_node"],
                          iteration_time_s=c.get("median_iteration_time_s"),
                          mem_max_allocated_bytes=c.get("mem_max_allocated_bytes"),
                          mem_max_allocated_bytes_early=c.get(
                              "mem_max_allocated_bytes_early"),
                          mem_allocated_bytes=c.get("mem_allocated_bytes"),
                          launch=None, error=None)
        launch, error = _parse(case.target_argv)
        out.append(GoldenCase(**{**{f: getattr(case, f) for f in GoldenCase.__slots__},
                                 "launch": launch, "error": error}))
    return out


def source(path: str | Path | None = None) -> dict:
    """Where the data set comes from (repository, commit, date, warmup dropped)."""
    return json.loads(Path(path or DEFAULT_PATH).read_text())["source"]


def as_runs(cases: list[GoldenCase]) -> list:
    """The timed cases as published-run records (what ``mode=calibrate`` and
    ``mode=validate`` take): measured tokens/s/GPU from the iteration time, source
    ``megatron-lm-golden/<family>`` (so that holding out a source holds out a family)."""
    from primus_ext.published.reader import Measured, PublishedRun
    out = []
    for c in cases:
        if c.spec is None or not c.iteration_time_s:
            continue
        tokens = c.spec.tokens_per_step / c.iteration_time_s / c.spec.world_size
        out.append(PublishedRun(
            run_id=c.case, row={"model": c.case}, spec=c.spec, error=None,
            measured=Measured(tokens_per_s_per_gpu=tokens, step_time_s=c.iteration_time_s),
            source=f"megatron-lm-golden/{c.family}", gpu="H100", is_moe=c.is_moe,
            precision=c.spec.train.precision, hardware_preset=HARDWARE))
    return out
