"""Pictures (PNG, matplotlib's Agg backend, no display needed).

- ``plot_timeline(estimate, path)``: the simulated pipeline timeline of one step.
- ``plot_memory(spec, report, path)``: per-stage memory by category against the device.
- ``plot_trials(trials, path, winner=, baseline=)``: the tuner's candidates, tokens/s/GPU
  against peak memory.

matplotlib is imported inside each function: importing this module costs nothing.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable, Sequence

GIB = 2**30

# One colour per kind of time or memory, shared by all pictures (colour-blind-safe set).
COLOURS = {
    "forward": "#4C72B0",
    "backward": "#DD8452",
    "weight": "#55A868",
    "recompute": "#8172B3",
    "communication": "#C44E52",
    "optimizer": "#CCB974",
    "bubble": "#E8E8E8",
    "weights": "#4C72B0",
    "grads": "#DD8452",
    "optimizer state": "#55A868",
    "activations": "#8172B3",
    "other": "#937860",
    "device": "#C44E52",
}
_KIND_COLOUR = {"F": "forward", "B": "backward", "W": "weight"}


def _pyplot():
    import matplotlib
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt
    return plt


def _save(fig, path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        fig.savefig(tmp, dpi=120, bbox_inches="tight", format="png")
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
        _pyplot().close(fig)
    return path


# ---- timeline --------------------------------------------------------------------------

def _op_shares(estimate, events) -> tuple[float, float]:
    """(communication share of every op, recompute share of every backward op).

    The schedule only knows op intervals; what an op is made of comes from the critical
    stage's breakdown (exposed TP/CP/EP comm is inside the ops, recompute inside the
    backward), and is applied to every op of every stage as an approximation.
    """
    b = estimate.breakdown
    comm = b.get("tp_comm_s", 0.0) + b.get("cp_comm_s", 0.0) + b.get("ep_comm_s", 0.0)
    inside = b.get("compute_s", 0.0) + b.get("recompute_s", 0.0) + comm
    comm_share = comm / inside if inside > 0 else 0.0
    crit = estimate.critical_stage
    bwd = sum(e.end_s - e.start_s for e in events if e.stage == crit and e.kind == "B")
    recompute_share = min(b.get("recompute_s", 0.0) / bwd, 1.0) if bwd > 0 else 0.0
    return comm_share, recompute_share


def _tails(estimate, pipeline_s: float) -> list[tuple[float, float]]:
    """Per stage, (exposed DP sync, optimizer) seconds after the pipeline drains."""
    busy = estimate.stage_busy_s
    crit = estimate.critical_stage
    crit_tail = max(busy[crit] - pipeline_s, 0.0)
    opt_share = (min(estimate.breakdown.get("optimizer_s", 0.0) / crit_tail, 1.0)
                 if crit_tail > 0 else 0.0)
    out = []
    for total in busy:
        tail = max(total - pipeline_s, 0.0)
        out.append((tail * (1 - opt_share), tail * opt_share))
    return out


def plot_timeline(estimate, path) -> Path:
    """The simulated pipeline of one step of ``estimate``: one row per stage.

    ``estimate`` must come from ``project(spec, record_timeline=True)``. Forward,
    backward and weight-gradient ops are the schedule's; the recompute part of each
    backward and the exposed in-layer communication of each op are drawn as shares taken
    from the critical stage's breakdown; after the pipeline drains come the exposed
    data-parallel sync and the optimizer step; idle time inside the step is bubble.
    """
    tl = getattr(estimate, "timeline", None)
    if tl is None or tl.events is None:
        raise ValueError("estimate.timeline=None: the timeline plot needs the simulated "
                         "ops; use project(spec, record_timeline=True)")
    plt = _pyplot()
    from matplotlib.patches import Patch

    p, m = tl.num_stages, tl.num_microbatches
    ms = 1e3
    step_ms = estimate.step_time_s * ms
    comm_share, recompute_share = _op_shares(estimate, tl.events)
    bars: dict[str, list[list[tuple[float, float]]]] = {
        k: [[] for _ in range(p)] for k in ("forward", "backward", "weight", "recompute",
                                            "communication", "optimizer")}
    labels = []
    label_min_ms = 0.025 * step_ms  # a label fits in a bar wider than 2.5% of the step
    for e in tl.events:
        start, dur = e.start_s * ms, (e.end_s - e.start_s) * ms
        if dur <= 0:
            continue
        kind = _KIND_COLOUR[e.kind]
        rec = dur * recompute_share if e.kind == "B" else 0.0
        com = (dur - rec) * comm_share
        if rec > 0:
            bars["recompute"][e.stage].append((start, rec))
        bars[kind][e.stage].append((start + rec, dur - rec - com))
        if com > 0:
            bars["communication"][e.stage].append((start + dur - com, com))
        if dur >= label_min_ms:
            labels.append((start + dur / 2, e.stage, str(e.microbatch)
                           if tl.num_chunks == 1 else f"{e.microbatch}.{e.chunk}"))
    for s, (sync_s, opt_s) in enumerate(_tails(estimate, tl.step_s)):
        t = tl.step_s * ms
        if sync_s > 0:
            bars["communication"][s].append((t, sync_s * ms))
        if opt_s > 0:
            bars["optimizer"][s].append((t + sync_s * ms, opt_s * ms))

    height = 0.7
    # White edges separate ops while an op is several pixels wide (about 1300 px span
    # the step); below that they would paint the row white.
    widest = max((d for rows in bars.values() for row in rows for _, d in row), default=0)
    edge = 0.3 if widest / step_ms * 1300 > 8 * 4 else 0.0
    fig, ax = plt.subplots(figsize=(12, 2.4 + 0.45 * p), layout="constrained")
    for s in range(p):
        y = s - height / 2
        ax.broken_barh([(0, step_ms)], (y, height), facecolors=COLOURS["bubble"])
        for kind, rows in bars.items():
            if rows[s]:
                ax.broken_barh(rows[s], (y, height), facecolors=COLOURS[kind],
                               edgecolors="white", linewidth=edge)
    for x, s, text in labels:
        ax.text(x, s, text, ha="center", va="center", fontsize=7, color="white")

    ax.set_ylim(p - 0.5, -0.5)  # stage 0 on top
    ax.set_yticks(range(p))
    ax.set_yticklabels([f"stage {s}" for s in range(p)])
    ax.set_xlim(0, step_ms * 1.01)
    ax.set_xlabel("time in step (ms)")
    bubble = estimate.breakdown.get("pp_bubble_s", 0.0) / estimate.step_time_s
    chunks = f", {tl.num_chunks} chunks per stage" if tl.num_chunks > 1 else ""
    ax.set_title(f"simulated step: {tl.schedule} schedule, {p} stages x {m} microbatches"
                 f"{chunks}\nstep {step_ms:,.1f} ms, pipeline bubble on the critical stage "
                 f"(stage {estimate.critical_stage}) {bubble:.1%}", fontsize=10)
    ax.grid(axis="x", color="#BBBBBB", linewidth=0.5, alpha=0.6)
    ax.set_axisbelow(True)
    present = [k for k, rows in bars.items() if any(rows)] + ["bubble"]
    names = {"communication": "exposed comm (TP/CP/EP in ops; DP sync at end)",
             "weight": "weight grad", "bubble": "idle (bubble)"}
    note = ("labels: microbatch" + (".chunk" if tl.num_chunks > 1 else "") + " (from 0)"
            + "; recompute and comm inside ops: the critical stage's shares")
    legend = fig.legend(handles=[Patch(facecolor=COLOURS[k], edgecolor="#999999",
                                       label=names.get(k, k)) for k in present],
                        loc="outside lower center", ncol=min(len(present), 4), fontsize=8,
                        frameon=False, title=note, title_fontsize=7)
    legend.get_title().set_color("#555555")
    return _save(fig, path)


# ---- memory ----------------------------------------------------------------------------

_MEMORY_PARTS = (("weights", "param_bytes"), ("grads", "grad_bytes"),
                 ("optimizer state", "optimizer_bytes"), ("activations", "activation_bytes"),
                 ("other", "other_bytes"))


def plot_memory(spec, report, path) -> Path:
    """Per-stage memory of one GPU, stacked by category, against the device's capacity."""
    plt = _pyplot()
    stages = list(report.stages)
    if not stages:
        raise ValueError("report.stages is empty: nothing to plot")
    x = list(range(len(stages)))
    fig, ax = plt.subplots(figsize=(max(6.0, 1.5 + 0.6 * len(stages)), 5.2),
                           layout="constrained")
    bottom = [0.0] * len(stages)
    for name, attr in _MEMORY_PARTS:
        vals = [getattr(s, attr) / GIB for s in stages]
        if not any(vals):
            continue
        ax.bar(x, vals, 0.65, bottom=bottom, color=COLOURS[name], label=name,
               edgecolor="white", linewidth=0.5)
        bottom = [b + v for b, v in zip(bottom, vals)]
    totals = [s.total_bytes / GIB for s in stages]
    for i, t in enumerate(totals):
        ax.text(i, t, f"{t:.1f}", ha="center", va="bottom", fontsize=8)
    cap = report.device_bytes / GIB
    ax.axhline(cap, color=COLOURS["device"], linestyle="--", linewidth=1.5,
               label=f"device capacity ({cap:.0f} GiB)")
    ax.set_ylim(0, max(max(totals), cap) * 1.18)
    ax.set_xticks(x)
    names = [getattr(s, "stage", i) for i, s in enumerate(stages)]
    ax.set_xticklabels([f"stage {n}" if len(stages) <= 8 else str(n) for n in names])
    if len(stages) > 8:
        ax.set_xlabel("pipeline stage")
    ax.set_ylabel("memory per GPU (GiB)")
    peak = max(totals)
    verdict = "fits" if peak <= cap else "DOES NOT FIT"
    ax.set_title(f"{spec.model.name}: memory per GPU by pipeline stage\n{_layout(spec)} | "
                 f"peak {peak:.1f} of {cap:.0f} GiB: {verdict}", fontsize=10)
    ax.grid(axis="y", color="#BBBBBB", linewidth=0.5, alpha=0.6)
    ax.set_axisbelow(True)
    fig.legend(loc="outside lower center", ncol=3, fontsize=8, frameon=False)
    return _save(fig, path)


def _layout(spec) -> str:
    p, t = spec.parallel, spec.train
    return (f"{spec.world_size} x {spec.cluster.hardware.name}, TP{p.tp} PP{p.pp} VPP{p.vpp} "
            f"CP{p.cp} EP{p.ep} DP{spec.dp}, MBS {t.micro_batch_size} "
            f"seq {t.seq_length} {t.precision}")


# ---- tuner trials ----------------------------------------------------------------------

def _field(obj: Any, *names: str, default=None):
    for name in names:
        if isinstance(obj, dict):
            if obj.get(name) is not None:
                return obj[name]
        elif getattr(obj, name, None) is not None:
            return getattr(obj, name)
    return default


def trial_point(trial) -> dict | None:
    """What the trials plot needs from one trial: the tuner's Trial (figures in
    ``metrics``), a journal record (figures in ``estimate``), an ``Estimate.to_dict()``,
    or an object with the same names. None for a trial without a throughput (illegal,
    skipped)."""
    est = _field(trial, "estimate", "metrics", default=trial)
    tps = _field(est, "tokens_per_s_per_gpu")
    mem = _field(est, "peak_memory_bytes")
    mem_gib = mem / GIB if mem is not None else _field(est, "peak_memory_gib")
    if tps is None or mem_gib is None:
        return None
    device = _field(est, "device_bytes")
    verdict = _field(trial, "verdict")
    fits = _field(est, "fits", default=_field(trial, "fits"))
    if fits is None:
        fits = (verdict != "oom") if verdict is not None else (
            device is None or mem <= device)
    return {"tps": float(tps), "mem_gib": float(mem_gib), "fits": bool(fits),
            "label": _label(trial), "device_gib": device / GIB if device else None}


def _label(trial) -> str:
    label = _field(trial, "label", "name", "overrides")
    if label is None:
        cand = _field(trial, "candidate")
        if isinstance(cand, dict):
            try:  # the tuner's own one-line form of a candidate
                from primus_ext.tune.space import AXES, describe
                return describe(tuple(cand.get(a) for a in AXES))
            except (ImportError, KeyError, TypeError, AttributeError):
                label = [f"{k}={v}" for k, v in cand.items() if v is not None]
    if isinstance(label, (list, tuple)):
        label = " ".join(str(x) for x in label)
    return "" if label is None else str(label)


def plot_trials(trials: Iterable, path, *, winner=None, baseline=None,
                device_gib: float | None = None, title: str | None = None) -> Path:
    """Every scored candidate as tokens/s/GPU against peak memory per GPU; candidates
    that do not fit are hollow; the winner (star) and the baseline (diamond) are marked
    and labelled. ``device_gib`` draws the device's capacity."""
    plt = _pyplot()
    points = [pt for pt in (trial_point(t) for t in trials) if pt is not None]
    if device_gib is None:  # the tuner's records carry the device's HBM
        device_gib = next((p["device_gib"] for p in points if p["device_gib"]), None)
    fig, ax = plt.subplots(figsize=(8, 6), layout="constrained")
    fit = [pt for pt in points if pt["fits"]]
    oom = [pt for pt in points if not pt["fits"]]
    if fit:
        ax.scatter([p["mem_gib"] for p in fit], [p["tps"] for p in fit], s=22,
                   color=COLOURS["forward"], alpha=0.7, label=f"fits ({len(fit)})")
    if oom:
        ax.scatter([p["mem_gib"] for p in oom], [p["tps"] for p in oom], s=22,
                   facecolors="none", edgecolors="#888888",
                   label=f"does not fit ({len(oom)})")
    if device_gib:
        ax.axvline(device_gib, color=COLOURS["device"], linestyle="--", linewidth=1.2,
                   label=f"device capacity ({device_gib:.0f} GiB)")
    top = max((p["tps"] for p in points), default=1.0)
    for trial, marker, colour, name in ((baseline, "D", "#333333", "baseline"),
                                        (winner, "*", "#E1A100", "winner")):
        pt = trial_point(trial) if trial is not None else None
        if pt is None:
            continue
        top = max(top, pt["tps"])
        # The point gets a short tag; what it is (its overrides) goes in the legend below
        # the axes, where a long label cannot cover other points.
        detail = f"\n{_short(pt['label'])}" if pt["label"] else ""
        ax.scatter([pt["mem_gib"]], [pt["tps"]], marker=marker, s=220 if marker == "*"
                   else 90, color=colour, edgecolors="black", linewidths=0.8, zorder=5,
                   label=f"{name}: {pt['tps']:,.0f} tok/s/GPU, {pt['mem_gib']:.1f} GiB"
                         f"{detail}")
        ax.annotate(name, (pt["mem_gib"], pt["tps"]), xytext=(8, 8),
                    textcoords="offset points", fontsize=8, fontweight="bold",
                    color=colour, zorder=6)
    ax.set_xlabel("peak memory per GPU (GiB)")
    ax.set_ylabel("tokens/s/GPU")
    ax.set_title(title or f"tuner candidates ({len(points)} scored)", fontsize=10)
    ax.grid(color="#BBBBBB", linewidth=0.5, alpha=0.6)
    ax.set_axisbelow(True)
    ax.set_xlim(left=0)
    ax.set_ylim(0, top * 1.12)
    if points or winner is not None or baseline is not None:
        fig.legend(loc="outside lower center", ncol=2, fontsize=8, frameon=False)
    return _save(fig, path)


def _short(label: str, width: int = 48) -> str:
    """Wrap a long label of space-separated overrides onto lines of about ``width``."""
    lines, line = [], ""
    for word in label.split():
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}".strip()
    lines.append(line)
    return "\n".join(lines[:4])


__all__: Sequence[str] = ("plot_timeline", "plot_memory", "plot_trials", "trial_point")
