"""A preset's host speed from its own host-bound published rows.

A preset without host-time cases of its own (published/golden.py) takes its host
constants from the preset that has them (fit._inherit_host): the donor's fitted values,
``host_speed`` scaled by the cited ratio of the two node CPUs, 1 where none is cited (an
AMD MI355X node against a DGX H100). A published micro-batch sweep on one node measures
that host directly: where a step is set by the host issuing the layers' kernels, twice
the tokens per microbatch take the same time (DeepSeek-V2-Lite on 8 MI355X, AMD Primus'
MoE package, Figure 6: 10,735 tokens/s/GPU at MBS 1, 21,028 at MBS 2, 28,063 at MBS 4).

So where at least ``MIN_HOST_BOUND_ROWS`` of a preset's rows are host-bound (halving the
host speed would cost them ``HOST_BOUND_SENSITIVITY`` of their throughput or more),
``mode=calibrate`` fits that preset's ``host_speed`` on its rows: centred on the
inherited value with the host constants' wide prior, its other constants held (the
per-call host seconds are the donor's, the same software stack's). Its efficiency knobs
are then refitted with that host speed. ``host_speed`` divides the Python and
dispatcher seconds of every op (compute/host.py), the part of the host time a node's CPU
sets; a slower kernel-launch path of another driver stack shows up in it too, since no
row of the set separates the two.

The held-out fits (modes/calibrate.py ``held_out_results``) take the all-source host
constants with each row-fitted speed replaced by the value it was fitted from
(``donor_host_constants``), so a held-out source's host-bound rows never inform their
own projection.
"""
from __future__ import annotations

import dataclasses

# Halving the host speed slows a host-bound row by this share of its throughput or more.
HOST_BOUND_SENSITIVITY = 0.2
# Host-bound rows a preset needs before its rows, not the donor, set its host speed.
MIN_HOST_BOUND_ROWS = 2
META_KEY = "host_speed_from_rows"


def _tokens(est) -> float | None:
    return est.tokens_per_s_per_gpu if est is not None else None


def host_bound_rows(rows, held: dict, project_row) -> int:
    """Rows whose projected throughput halving the host speed cuts by at least
    ``HOST_BOUND_SENSITIVITY``."""
    slow = {**held, "host_speed": held["host_speed"] / 2}
    n = 0
    for run, _ in rows:
        a, b = _tokens(project_row(run, held)), _tokens(project_row(run, slow))
        if a and b and a / b - 1 >= HOST_BOUND_SENSITIVITY:
            n += 1
    return n


def fit_row_host_speeds(by_hw: dict, skip, constants: dict, fit_once, project_row,
                        efficiency_knobs, rounded) -> dict:
    """Fit ``host_speed`` (then the efficiencies) of every preset of ``by_hw`` not in
    ``skip`` (those with host-time cases) that has host constants and enough host-bound
    rows; updates ``constants`` in place. Returns {preset: {"inherited", "fitted",
    "host_bound_rows"}}."""
    out = {}
    for name, rows in sorted(by_hw.items()):
        held = dict(constants.get(name, {}))
        hw = rows[0][0].spec.cluster.hardware
        if name in skip or "host_speed" not in held or not hw.host_clock:
            continue
        bound = host_bound_rows(rows, held, project_row)
        if bound < MIN_HOST_BOUND_ROWS:
            continue

        def project_held(run, values, held=held):
            return project_row(run, {**held, **values})
        centre = dataclasses.replace(hw, **held)  # the prior: the inherited value
        values, _, _ = fit_once(("host_rows", name, tuple(sorted(held.items()))), centre,
                                rows, project_held, knobs=("host_speed",))
        speed = rounded(values["host_speed"])
        held_host = {**held, "host_speed": speed}

        def project_host(run, values, held=held_host):
            return project_row(run, {**held, **values})
        eff, _, _ = fit_once(("efficiency_host", name, speed), hw, rows, project_host,
                             knobs=efficiency_knobs(rows), start=held)
        constants[name] = {**held_host, **{k: rounded(v) for k, v in eff.items()}}
        out[name] = {"inherited": held["host_speed"], "fitted": speed,
                     "host_bound_rows": bound}
    return out


def donor_host_constants(calib, host_fields) -> dict:
    """{preset: host constants} of an all-source calibration, each row-fitted host speed
    replaced by the inherited value it was fitted from."""
    row_fitted = calib.meta.get(META_KEY, {})
    out = {}
    for name, values in calib.constants.items():
        host = {k: v for k, v in values.items() if k in host_fields}
        if name in row_fitted and "host_speed" in host:
            host["host_speed"] = row_fitted[name]["inherited"]
        if host:
            out[name] = host
    return out
