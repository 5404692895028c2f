"""Fit the physical efficiency constants of each hardware preset to measured runs.

Per hardware, the fitted constants minimise the mean squared log error of projected
against measured tokens/s/GPU, plus a penalty pulling each constant toward its preset
prior (a preset with few measured rows stays near its datasheet-derived priors instead
of absorbing one row's quirks). Coordinate descent on a multiplicative grid; each
constant stays inside its physical bounds. Only HardwareSpec fields are fitted: no
constant is keyed to a model, a source or a row.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from primus_ext.project.calibration import Calibration
from primus_ext.spec import HardwareSpec

# (field, lower bound, upper bound). Fractions of a peak stay in (0, 1].
# Upper bounds are the best fractions of peak measured anywhere in
# docs/reference achievable-performance (GEMM 0.87 on A100, FA3 0.76, NCCL ~0.9 of a NIC).
FITTED = (
    ("gemm_efficiency", 0.2, 0.9),
    ("attention_efficiency", 0.2, 0.85),
    ("scale_out_efficiency", 0.2, 0.95),
)
# Gaussian prior on log(constant / preset prior): a row's log error is taken to have a
# spread of ROW_SIGMA, a preset prior one of PRIOR_SIGMA; the penalty per constant is
# (ROW_SIGMA / PRIOR_SIGMA)^2 * log(c/c0)^2 / rows, against the mean squared row error.
ROW_SIGMA = 0.10
PRIOR_SIGMA = 0.15
_STEPS = (1.25, 1.1, 1.04, 1.015)


@dataclass(frozen=True, slots=True)
class FitReport:
    calibration: Calibration
    per_hardware: dict  # name -> {"rows": n, "before": msle, "after": msle, constants}


def _loss(rows, hw_values: dict, project_row) -> float:
    errs = []
    for run, measured in rows:
        est = project_row(run, hw_values)
        if est is None:
            continue
        errs.append(math.log(est.tokens_per_s_per_gpu / measured) ** 2)
    return sum(errs) / len(errs) if errs else 0.0


def _objective(rows, values, prior, project_row) -> float:
    penalty = sum(math.log(values[k] / prior[k]) ** 2 for k in values)
    weight = (ROW_SIGMA / PRIOR_SIGMA) ** 2 / max(len(rows), 1)
    return _loss(rows, values, project_row) + weight * penalty


def fit_hardware(hw: HardwareSpec, rows, project_row, fields=FITTED) -> tuple[dict, float, float]:
    """Fit one preset's constants; rows are (run, measured tokens/s/GPU) pairs.

    ``project_row(run, values)`` projects a run with the hardware's fields set to values.
    Returns (values, loss before, loss after).
    """
    names = [f for f, _, _ in fields if hasattr(hw, f)]
    bounds = {f: (lo, hi) for f, lo, hi in fields}
    prior = {f: getattr(hw, f) for f in names}
    values = dict(prior)
    before = _loss(rows, values, project_row)
    best = _objective(rows, values, prior, project_row)
    for step in _STEPS:
        improved = True
        while improved:
            improved = False
            for f in names:
                for factor in (step, 1 / step):
                    lo, hi = bounds[f]
                    trial = dict(values)
                    trial[f] = min(max(values[f] * factor, lo), hi)
                    if trial[f] == values[f]:
                        continue
                    obj = _objective(rows, trial, prior, project_row)
                    if obj < best - 1e-9:
                        best, values, improved = obj, trial, True
    return values, before, _loss(rows, values, project_row)


def fit(runs, project_fn, base: Calibration | None = None) -> FitReport:
    """Fit every hardware preset that has measured rows among ``runs``.

    ``runs``: PublishedRun-like objects with ``spec`` and a measured tokens figure
    (see validate.measured_tokens); ``project_fn(spec)`` -> Estimate (no calibration).
    """
    from primus_ext.project.validate import measured_tokens

    by_hw: dict[str, list] = {}
    for run in runs:
        tokens, _ = measured_tokens(run)
        if run.spec is None or not tokens:
            continue
        by_hw.setdefault(run.spec.cluster.hardware.name, []).append((run, tokens))

    def project_row(run, values):
        spec = run.spec
        hw = dataclasses.replace(spec.cluster.hardware, **values)
        spec = dataclasses.replace(spec, cluster=dataclasses.replace(spec.cluster, hardware=hw))
        try:
            return project_fn(spec)
        except ValueError:
            return None

    constants = dict(base.constants) if base else {}
    report = {}
    for name, rows in sorted(by_hw.items()):
        hw = rows[0][0].spec.cluster.hardware
        values, before, after = fit_hardware(hw, rows, project_row)
        constants[name] = {k: round(v, 4) for k, v in values.items()}
        report[name] = {"rows": len(rows), "msle_before": before, "msle_after": after,
                        **constants[name]}
    meta = {"fitted_constants": [f for f, _, _ in FITTED], "row_sigma": ROW_SIGMA,
            "prior_sigma": PRIOR_SIGMA}
    return FitReport(calibration=Calibration(constants=constants, meta=meta),
                     per_hardware=report)
