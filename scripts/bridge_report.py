"""The Megatron-Bridge tables outside the public set, for docs/accuracy.md: every MoE row
of the releases' tables that ``published_runs.csv`` does not hold
(``tests/data/bridge_other_releases.csv``, built by scripts/bridge_other_releases.py),
projected with the committed calibration. No constant was fitted on them."""
from __future__ import annotations

from pathlib import Path

from primus_ext.project.validate import percentile, project_run
from primus_ext.published import read_runs
from primus_ext.published.bridge_moe import precision_kind, release_of

LABEL = {"bf16": "BF16", "fp8_cs": "FP8", "fp8_mx": "MXFP8"}
ROWS = Path(__file__).resolve().parents[1] / "tests" / "data" / "bridge_other_releases.csv"


def bridge_results(calib) -> list:
    return [(r, project_run(r, calib)) for r in read_runs(ROWS)]


def bridge_section(calib) -> list[str]:
    res = bridge_results(calib)
    errs = [abs(x.rel_error) for _, x in res if x.rel_error is not None]
    if not errs:
        return []
    lines = ["## Megatron-Bridge releases outside the set (never fitted)", "",
             f"{len(errs)} MoE rows of Megatron-Bridge's per-release tables (25.11 to 26.06.01) "
             "whose release, system, model, precision and GPU count the public set does not "
             "hold (`tests/data/bridge_other_releases.csv`). Each is read with its release's "
             "own recipe (`primus_ext/published/bridge_presets.py`) and projected with the "
             f"committed calibration: median |error| **{percentile(errs, 50):.1%}**, p90 "
             f"**{percentile(errs, 90):.1%}**, {sum(e <= 0.12 for e in errs)} of "
             f"{len(errs)} within 12 %.", "",
             "| row | release | system | model | precision | layout | measured | projected "
             "| error |", "| --- | --- | --- | --- | --- | --- | ---: | ---: | ---: |"]
    for run, x in res:
        if x.rel_error is None:
            continue
        p = run.spec.parallel
        vp = f" VP{p.vpp}" if p.vpp > 1 else ""
        prec = LABEL[precision_kind(run.precision, run.row["notes"])]
        lines.append(
            f"| {run.run_id} | {release_of(run.source)} | {run.gpu} | "
            f"{run.row['model']} | {prec} | TP{p.tp} PP{p.pp}{vp} EP{p.ep} "
            f"MBS{run.spec.train.micro_batch_size} | "
            f"{x.measured_tokens_per_s_per_gpu:,.0f} | {x.estimate.tokens_per_s_per_gpu:,.0f} "
            f"| {x.rel_error:+.1%} |")
    return lines
