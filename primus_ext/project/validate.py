"""Project published runs and compare with their measured throughput.

The measured figure is tokens/s/GPU. Rows that publish only model TFLOP/s/GPU (or only
MFU, taken against the dense peak of the run's precision) are converted with our FLOP
formula (sources' formulas differ; the row's notes say so).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from primus_ext.compute.model_flops import model_flops_per_token


@dataclass(frozen=True, slots=True)
class RowResult:
    run_id: str
    model: str
    source: str
    gpu: str
    arch: str  # dense | moe
    precision: str
    estimate: object | None  # Estimate
    error: str | None  # why the row could not be projected
    measured_tokens_per_s_per_gpu: float | None
    measured_from: str  # "tokens" | "tflops" | "mfu" | ""
    recompute_inferred: bool = False  # the source left recompute unstated

    @property
    def band(self) -> dict | None:
        """The projection's error band (project/bands.py), or None."""
        return self.estimate.error_band(self.recompute_inferred) if self.estimate else None

    @property
    def rel_error(self) -> float | None:
        if self.estimate is None or not self.measured_tokens_per_s_per_gpu:
            return None
        return self.estimate.tokens_per_s_per_gpu / self.measured_tokens_per_s_per_gpu - 1


def measured_tokens(run) -> tuple[float | None, str]:
    m = run.measured
    if m.get("tokens_per_s_per_gpu"):
        return m["tokens_per_s_per_gpu"], "tokens"
    if run.spec is None:
        return None, ""
    per_token = model_flops_per_token(run.spec.model, run.spec.train.seq_length,
                                      getattr(run, "flops_causal_halved", True))
    if m.get("tflops_per_gpu"):
        return m["tflops_per_gpu"] * 1e12 / per_token, "tflops"
    if m.get("mfu"):  # model FLOPs over the dense peak of the run's precision
        peak = run.spec.cluster.hardware.peak_tflops(run.spec.train.precision)
        return m["mfu"] * peak * 1e12 / per_token, "mfu"
    return None, ""


def project_run(run, calibration, project_fn=None) -> RowResult:
    from primus_ext.project.estimate import project

    fn = project_fn or project
    est, err = None, run.error
    if run.spec is not None:
        try:
            est = fn(run.spec, calibration=calibration)
        except ValueError as exc:
            err = str(exc)
    tokens, how = measured_tokens(run)
    return RowResult(run_id=run.run_id, model=run.row.get("model", ""), source=run.source, gpu=run.gpu,
                     arch="moe" if run.is_moe else "dense", precision=run.precision or "",
                     estimate=est, error=err, measured_tokens_per_s_per_gpu=tokens,
                     measured_from=how, recompute_inferred=recompute_inferred(run))


def recompute_inferred(run) -> bool:
    """The source left the recompute cell empty: the reader inferred the setting (its
    recipe rules or the memory verdict)."""
    row = getattr(run, "row", None) or {}
    return "recompute" in row and not (row.get("recompute") or "").strip()


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (q in [0, 100]) of a non-empty list."""
    xs = sorted(values)
    k = (len(xs) - 1) * q / 100
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def group_keys(r: RowResult, sources: bool = False) -> tuple[str, ...]:
    keys = ("all", f"gpu={r.gpu}", f"arch={r.arch}", f"precision={r.precision}")
    return keys + (f"source={r.source}",) if sources else keys


def summarize(results: list[RowResult], sources: bool = False
              ) -> list[tuple[str, int, float, float]]:
    """(group, rows, median |error|, p90 |error|) overall, per GPU, dense/MoE, precision
    (and per source with ``sources``)."""
    groups: dict[str, list[float]] = {}
    for r in results:
        e = r.rel_error
        if e is None:
            continue
        for key in group_keys(r, sources):
            groups.setdefault(key, []).append(abs(e))
    order = sorted(groups, key=lambda k: (k != "all", k))
    return [(k, len(groups[k]), percentile(groups[k], 50), percentile(groups[k], 90))
            for k in order]
