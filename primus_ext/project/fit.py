"""Fit the physical efficiency constants of each hardware preset to measured runs.

Per hardware, a few physical constants (``FITTED``) are chosen to minimise a robust loss
of the log error of projected against measured tokens/s/GPU, plus a Gaussian prior that
pulls each constant toward its preset value (a preset with few measured rows stays near
its datasheet-derived priors instead of absorbing one row's quirks). Only HardwareSpec
fields are fitted: no constant is keyed to a model, a source or a row.

Each fitted *knob* scales one or more HardwareSpec fields by a common factor, so that
fields that describe one physical thing move together (flash attention's forward and
backward asymptotes are one kernel family). The fitted values are written back as the
fields themselves, clipped to their physical bounds.

Loss: the pseudo-Huber function of the log error with scale ``ROW_SIGMA``: quadratic for
errors within about 10 %, linear beyond, so that a source whose software stack sits off
the physics (a row group the projector cannot explain) moves the constants less than
under least squares. The prior adds ``(ROW_SIGMA^2 / n) * sum(log(c/c0)^2 / (2
PRIOR_SIGMA^2))``: the negative log-likelihood of Gaussian errors and priors, divided by
the row count over ROW_SIGMA^2, which keeps both terms on the scale of the mean loss.

Search: coordinate descent on a multiplicative grid, refined in four passes.

Presets with no measured rows of their own inherit the fitted constants of a fitted
preset of their ``calibration_family`` (the same silicon at the same power, e.g. H200 and
H800 from H100): the fitted fields are fractions of each preset's own peaks, which those
presets share.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from primus_ext.project.calibration import Calibration
from primus_ext.project.fit_host_rows import (META_KEY, donor_host_constants,
                                              fit_row_host_speeds)
from primus_ext.spec import HardwareSpec

# knob -> (HardwareSpec fields it scales, lower bound, upper bound of each field). Upper
# bounds are the best fractions of peak measured anywhere in docs/reference
# achievable-performance (GEMM 0.87 of A100 BF16, FP8 0.77, FA3 0.76 of peak forward, a
# NIC at 0.96 of its line rate); lower bounds are well below any measured training run.
FITTED = {
    "gemm": (("gemm_efficiency",), 0.3, 0.9),
    "fp8_gemm": (("fp8_gemm_efficiency",), 0.25, 0.85),
    "attention": (("attention_efficiency", "attention_bwd_efficiency"), 0.1, 0.9),
    "scale_out": (("scale_out_efficiency",), 0.3, 0.96),
    # Unsynchronised host pauses (project/host_pauses.py): from a microsecond a second to
    # a millisecond a second of each rank's time; fitted only on presets with FSDP rows
    # whose group spans more than one rank (``_knobs``), with the host constants' wide
    # prior (no datasheet states it).
    "host_pause": (("host_pause_fraction",), 1e-6, 1e-3),
}
WIDE_PRIOR = {"host_pause"}
# The host clock's constants (spec/hardware.py, compute/host.py), fitted on runs whose
# step the host sets: Megatron-LM's GPU-measured functional tests (published/golden.py).
# Bounds: a node CPU from a tenth to ten times the reference host; launch 2-8 us (AP
# 5.1: 2.4 us device-side, 4-6 us host submission: the raw launch, Python apart); the
# others from nothing to
# several times the largest per-call figure published (TE issue 2053: a TE Linear
# forward's host time 13.5 us torch vs about 36 us TE on a DGX H100); a GroupedLinear's
# per-GEMM host time up to 20 us: the per-GEMM ops TE issue 1499 names (a torch.split
# view and two torch.empty) and the cuBLAS call, a few us each (AP 5.1).
HOST_FITTED = {
    "host_speed": (("host_speed",), 0.1, 10.0),
    "launch": (("launch_s",), 2e-6, 8e-6),
    "te_host": (("te_module_host_s",), 1e-6, 5e-4),
    "te_grouped": (("te_grouped_gemm_host_s",), 1e-6, 2e-5),
    "collective_host": (("collective_host_s",), 1e-6, 5e-4),
    "sync": (("sync_s",), 1e-6, 2e-4),
    "step_host": (("step_host_s",), 1e-4, 0.2),
}
ROW_SIGMA = 0.10
PRIOR_SIGMA = 0.15
# Host constants are known to within a factor of a few (no datasheet states them): a
# wide prior, in log units.
HOST_PRIOR_SIGMA = 1.0
KNOBS = {**FITTED, **HOST_FITTED}
HOST_FIELDS = frozenset(f for fs, _, _ in HOST_FITTED.values() for f in fs)
_STEPS = (1.25, 1.1, 1.04, 1.015)


def _inherit(constants: dict, rows_per_hw: dict) -> dict:
    """Presets without rows of their own take the fitted constants of a member of their
    ``calibration_family`` (same silicon at the same power; the one with most rows).
    Returns {preset: donor}."""
    from primus_ext.presets import hardware_preset, list_presets

    def family(name: str) -> str | None:
        try:
            return hardware_preset(name).calibration_family
        except (ValueError, TypeError):
            return None

    donors: dict[str, str] = {}
    for name in sorted(rows_per_hw, key=lambda n: -rows_per_hw[n]):
        fam = family(name)
        if fam and fam not in donors and name in constants:
            donors[fam] = name
    inherited = {}
    for name in list_presets("hardware"):
        fam = family(name)
        if name in rows_per_hw or not fam or fam not in donors:
            continue
        constants[name] = dict(constants[donors[fam]])
        inherited[name] = donors[fam]
    return inherited


def _inherit_host(constants: dict, rows_per_hw: dict) -> dict:
    """Presets with a host clock but no host rows of their own (nor a family member's)
    take the fitted host constants of the preset with most host rows, their node CPU's
    cited speed ratio applied: ``host_speed`` scaled by the two presets' prior ratio
    (spec/hardware.py; e.g. Grace against a DGX H100's Xeon). The other host constants
    are per-call seconds of the same software stack, carried over as fitted.
    Returns {preset: donor}."""
    from primus_ext.presets import hardware_preset, list_presets
    if not rows_per_hw:
        return {}
    donor = max(rows_per_hw, key=lambda n: rows_per_hw[n])
    prior = hardware_preset(donor)
    fitted = {k: v for k, v in constants[donor].items()
              if k in HOST_FIELDS}
    out = {}
    for name in list_presets("hardware"):
        hw = hardware_preset(name)
        have = constants.get(name, {})
        if name in rows_per_hw or not hw.host_clock or "host_speed" in have:
            continue
        ratio = hw.host_speed / prior.host_speed
        constants[name] = {**have, **fitted,
                           "host_speed": _sig(fitted["host_speed"] * ratio)}
        out[name] = f"{donor} (host, speed x {ratio:.3g})"
    return out


@dataclass(frozen=True, slots=True)
class FitReport:
    calibration: Calibration
    per_hardware: dict  # name -> {"rows": n, "before": loss, "after": loss, constants}


def _rho(e: float) -> float:
    d = ROW_SIGMA
    return d * d * (math.sqrt(1.0 + (e / d) ** 2) - 1.0)


def _values(hw: HardwareSpec, factors: dict) -> dict:
    out = {}
    for knob, f in factors.items():
        fields, lo, hi = KNOBS[knob]
        for name in fields:
            out[name] = min(max(getattr(hw, name) * f, lo), hi)
    return out


def _errors(rows, values: dict, project_row) -> list[float]:
    errs = []
    for run, measured in rows:
        est = project_row(run, values)
        if est is None:
            continue
        errs.append(math.log(est.tokens_per_s_per_gpu / measured))
    return errs


def _msle(errs: list[float]) -> float:
    return sum(e * e for e in errs) / len(errs) if errs else 0.0


def _objective(rows, hw, factors, project_row) -> float:
    errs = _errors(rows, _values(hw, factors), project_row)
    loss = sum(_rho(e) for e in errs) / max(len(errs), 1)
    penalty = sum(math.log(f) ** 2 / (2 * (HOST_PRIOR_SIGMA if k in HOST_FITTED
                                           or k in WIDE_PRIOR else PRIOR_SIGMA) ** 2)
                  for k, f in factors.items())
    return loss + ROW_SIGMA ** 2 / max(len(rows), 1) * penalty


def fit_hardware(hw: HardwareSpec, rows, project_row, knobs=tuple(FITTED),
                 start: dict | None = None) -> tuple[dict, float, float]:
    """Fit one preset's knobs; rows are (run, measured tokens/s/GPU) pairs.

    ``project_row(run, values)`` projects a run with the hardware's fields set to values.
    ``start``: field values to start the search from (a previous fit of the same preset;
    the search then begins at the finer steps). Returns (field values, mean squared log
    error before, after)."""
    factors = {k: 1.0 for k in knobs}
    before = _msle(_errors(rows, _values(hw, factors), project_row))
    steps = _STEPS
    if start:
        for k in knobs:
            first = KNOBS[k][0][0]
            if first in start and getattr(hw, first) > 0:
                factors[k] = start[first] / getattr(hw, first)
        steps = _STEPS[1:]
    best = _objective(rows, hw, factors, project_row)
    for step in steps:
        improved = True
        while improved:
            improved = False
            for k in knobs:
                for mult in (step, 1 / step):
                    trial = dict(factors)
                    trial[k] = factors[k] * mult
                    if _values(hw, trial) == _values(hw, factors):
                        continue  # pinned at a bound
                    obj = _objective(rows, hw, trial, project_row)
                    if obj < best - 1e-12:
                        best, factors, improved = obj, trial, True
    values = _values(hw, factors)
    return values, before, _msle(_errors(rows, values, project_row))


def _knobs(rows) -> tuple[str, ...]:
    """The efficiency knobs a preset's rows can inform: ``host_pause`` only where some
    row waits for other ranks' pauses (an FSDP group of more than one rank)."""
    from primus_ext.project.host_pauses import pause_group_size
    from primus_ext.project.torchtitan import simulated_view

    if any(pause_group_size(simulated_view(run.spec)) > 1 for run, _ in rows):
        return tuple(FITTED)
    return tuple(k for k in FITTED if k != "host_pause")


def usable_rows(runs) -> list[tuple]:
    """(run, measured tokens/s/GPU) for each run the fit can use: a valid spec and a
    measured figure."""
    from primus_ext.project.validate import measured_tokens
    out = []
    for run in runs:
        tokens, _ = measured_tokens(run)
        if run.spec is not None and tokens:
            out.append((run, tokens))
    return out


def _by_hardware(runs) -> dict[str, list]:
    by_hw: dict[str, list] = {}
    for run, tokens in usable_rows(runs):
        by_hw.setdefault(run.spec.cluster.hardware.name, []).append((run, tokens))
    return by_hw


def _sig(v: float) -> float:
    """Four significant digits (host constants are microseconds)."""
    return float(f"{v:.4g}")


def _rounded(v: float) -> float:
    """A fitted efficiency as stored: four decimals, small fractions (host pauses) to
    four significant digits."""
    return round(v, 4) if v >= 0.01 else _sig(v)


def fit(runs, project_fn, base: Calibration | None = None,
        warm: Calibration | None = None, host_runs=(), memo: dict | None = None,
        host_donor: Calibration | None = None) -> FitReport:
    """Fit every hardware preset that has measured rows among ``runs``.

    ``runs``: PublishedRun-like objects with ``spec`` and a measured tokens figure
    (see validate.measured_tokens); ``project_fn(spec)`` -> Estimate (no calibration).
    ``warm``: a calibration to start each preset's search from (leave-one-source-out
    refits start from the fit on all sources: fewer steps, and the coordinate descent may
    stop at a slightly different point than a cold start; on the public set the held-out
    p90 differs by about 0.3 points).
    ``host_runs``: runs whose step the host sets (published/golden.py): after the
    efficiency constants, each of their presets' host constants (``HOST_FITTED``) are
    fitted on them alone, the efficiencies held.
    ``memo``: a dict shared by the fits of one session over the same run objects (the
    leave-one-out refits): a preset whose rows, start and held constants repeat a fit
    already made takes its result, which the deterministic search would only reproduce.
    ``host_donor``: an all-source calibration whose host constants stand in for a host
    fit of this one (the leave-one-source-out refits: holding out a published source
    leaves the host-time rows as they are), each row-fitted host speed as inherited
    (project/fit_host_rows.py).
    """
    memo = {} if memo is None else memo

    def fit_once(key, hw, rows, project, **kw):
        key = (*key, tuple(id(run) for run, _ in rows),
               tuple(sorted((kw.get("start") or {}).items())))
        if key not in memo:  # the rows ride along: their ids stay theirs while memo lives
            memo[key] = (rows, fit_hardware(hw, rows, project, **kw))
        return memo[key][1]

    by_hw = _by_hardware(runs)

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
        start = warm.constants.get(name) if warm else None
        values, before, after = fit_once(("efficiency", name), hw, rows, project_row,
                                         start=start, knobs=_knobs(rows))
        constants[name] = {k: _rounded(v) for k, v in values.items()}
        report[name] = {"rows": len(rows), "msle_before": before, "msle_after": after,
                        **constants[name]}
    host_by_hw = _by_hardware(host_runs)
    for name, rows in sorted(host_by_hw.items()):
        hw = rows[0][0].spec.cluster.hardware
        held = {k: v for k, v in constants.get(name, {}).items()
                if k not in HOST_FIELDS}
        start = warm.constants.get(name) if warm else None

        def project_held(run, values, held=held):
            return project_row(run, {**held, **values})
        values, before, after = fit_once(("host", name, tuple(sorted(held.items()))), hw,
                                         rows, project_held, knobs=tuple(HOST_FITTED),
                                         start=start)
        constants[name] = {**constants.get(name, {}),
                           **{k: _sig(v) for k, v in values.items()}}
        report[f"{name} (host)"] = {"rows": len(rows), "msle_before": before,
                                    "msle_after": after,
                                    **{k: _sig(v) for k, v in values.items()}}
    inherited = _inherit(constants, {n: len(r) for n, r in
                                     {**by_hw, **host_by_hw}.items()})
    inherited.update(_inherit_host(constants, {n: len(r) for n, r in host_by_hw.items()}))
    skip = set(host_by_hw)  # presets whose host-time cases set their host constants
    if host_donor is not None:
        donor_host = donor_host_constants(host_donor, HOST_FIELDS)
        for name, host in donor_host.items():
            constants[name] = {**constants.get(name, {}), **host}
        skip |= set(donor_host) - set(host_donor.meta.get("inherited", {})) - set(
            host_donor.meta.get(META_KEY, {}))
    row_host = fit_row_host_speeds(by_hw, skip, constants, fit_once, project_row, _knobs,
                                   _rounded)
    meta = {"fitted_knobs": {k: list(v[0]) for k, v in KNOBS.items()},
            "host_prior_sigma": HOST_PRIOR_SIGMA,
            "loss": "pseudo-Huber of the log error", "row_sigma": ROW_SIGMA,
            "prior_sigma": PRIOR_SIGMA, "inherited": inherited, META_KEY: row_host}
    return FitReport(calibration=Calibration(constants=constants, meta=meta),
                     per_hardware=report)
