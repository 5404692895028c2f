"""Pictures (PNG, matplotlib's Agg backend, no display needed).

- ``plot_timeline(estimate, path)``: the simulated pipeline timeline of one step.
- ``plot_memory(spec, report, path)``: per-stage memory by category against the device.
- ``plot_trials(trials, path, winner=, baseline=)``: the tuner's candidates, tokens/s/GPU
  against peak memory (in ``trials_plot``, re-exported here).

matplotlib is imported inside each function: importing this module costs nothing.
"""
from __future__ import annotations

from pathlib import Path

from primus_ext.emit.plot_style import COLOURS, GIB
from primus_ext.emit.plot_style import pyplot as _pyplot
from primus_ext.emit.plot_style import save_png as _save
from primus_ext.emit.trials_plot import plot_trials, trial_point

_KIND_COLOUR = {"F": "forward", "B": "backward", "W": "weight"}


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


_LABEL_PX = 6  # width of one label character at fontsize 7 in a 1300-px-wide axis


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
        labels.append((start, dur, e.stage, str(e.microbatch) if tl.num_chunks == 1
                       else f"{e.microbatch}.{e.chunk}"))
    for s, (sync_s, opt_s) in enumerate(_tails(estimate, tl.step_s)):
        t = tl.step_s * ms
        if sync_s > 0:
            bars["communication"][s].append((t, sync_s * ms))
        if opt_s > 0:
            bars["optimizer"][s].append((t + sync_s * ms, opt_s * ms))

    # A long step (many microbatches) shows its start and its end, where the pipeline
    # fills and drains; the steady state between them is left out.
    period_ms = tl.ideal_s / m * ms  # one microbatch on the busiest stage
    edge_ms = (p + 3) * period_ms
    windows = [(0.0, step_ms)]
    if 6 * edge_ms < step_ms:
        windows = [(0.0, edge_ms), (tl.step_s * ms - edge_ms, step_ms)]
    shown_ms = sum(b - a for a, b in windows)
    fig, axes = plt.subplots(1, len(windows), figsize=(12, 2.4 + 0.45 * p), sharey=True,
                             layout="constrained", squeeze=False,
                             gridspec_kw={"width_ratios": [b - a for a, b in windows]})
    axes = axes[0]
    for ax, (lo, hi) in zip(axes, windows):
        px_per_ms = 1300 / shown_ms
        _draw_rows(ax, bars, p, step_ms, lo, hi, edge=period_ms / 2 * px_per_ms > 6)
        for start, dur, s, text in labels:
            # A label only where the bar holds it: about 6 px per character at 7 pt,
            # so interleaved labels ("12.3") need wider bars than plain ones ("12").
            if lo <= start + dur / 2 <= hi and dur * px_per_ms >= _LABEL_PX * len(text) + 4:
                ax.text(start + dur / 2, s, text, ha="center", va="center", fontsize=7,
                        color="white", clip_on=True)
    axes[0].set_ylim(p - 0.5, -0.5)  # stage 0 on top
    axes[0].set_yticks(range(p))
    axes[0].set_yticklabels([f"stage {s}" for s in range(p)])
    if len(windows) > 1:
        _break_marks(axes[0], axes[1])
    if len(windows) > 1:
        axes[0].set_xlabel("start of the step (ms)")
        axes[1].set_xlabel("end of the step (ms)")
    else:
        axes[0].set_xlabel("time in step (ms)")
    bubble = estimate.breakdown.get("pp_bubble_s", 0.0) / estimate.step_time_s
    chunks = f", {tl.num_chunks} chunks per stage" if tl.num_chunks > 1 else ""
    elided = (f"; steady state {windows[0][1]:,.0f}-{windows[1][0]:,.0f} ms not shown"
              if len(windows) > 1 else "")
    stages = f"{p} stage{'s' if p > 1 else ''}"
    fig.suptitle(f"simulated step: {tl.schedule} schedule, {stages} x {m} microbatches"
                 f"{chunks}\nstep {step_ms:,.1f} ms, pipeline bubble on the critical stage "
                 f"(stage {estimate.critical_stage}) {bubble:.1%}{elided}", fontsize=10)
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


def _draw_rows(ax, bars, p: int, step_ms: float, lo: float, hi: float, edge: bool) -> None:
    height = 0.7
    for s in range(p):
        y = s - height / 2
        ax.broken_barh([(0, step_ms)], (y, height), facecolors=COLOURS["bubble"])
        for kind, rows in bars.items():
            # White edges separate ops a few pixels wide; on narrower ones they would
            # paint the row white.
            if rows[s]:
                ax.broken_barh(rows[s], (y, height), facecolors=COLOURS[kind],
                               edgecolors="white", linewidth=0.3 if edge else 0.0)
    ax.set_xlim(lo, hi + (hi - lo) * 0.01)
    ax.grid(axis="x", color="#BBBBBB", linewidth=0.5, alpha=0.6)
    ax.set_axisbelow(True)


def _break_marks(left, right) -> None:
    """The usual // marks of a broken x axis between two panels."""
    left.spines["right"].set_visible(False)
    right.spines["left"].set_visible(False)
    right.tick_params(axis="y", left=False)
    kw = {"marker": [(-1, -1.5), (1, 1.5)], "markersize": 10, "linestyle": "none",
          "color": "k", "mec": "k", "mew": 1, "clip_on": False}
    left.plot([1, 1], [0, 1], transform=left.transAxes, **kw)
    right.plot([0, 0], [0, 1], transform=right.transAxes, **kw)


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
        ax.text(i, t, f"{t:.1f}", ha="center", va="bottom", fontsize=8, zorder=4,
                bbox={"boxstyle": "square,pad=0.15", "fc": "white", "ec": "none",
                      "alpha": 0.85})
    cap = report.device_bytes / GIB
    ax.axhline(cap, color=COLOURS["device"], linestyle="--", linewidth=1.5,
               label=f"device capacity ({cap:.0f} GiB)")
    margin = getattr(report, "margin_fraction", 0.0) or 0.0
    if margin > 0:  # the report's fits verdict keeps this share of the device free
        ax.axhline(cap / (1 + margin), color=COLOURS["device"], linestyle=":",
                   linewidth=1.2, label=f"usable with {margin:.0%} margin "
                                        f"({cap / (1 + margin):.1f} GiB)")
    ax.set_ylim(0, max(max(totals), cap) * 1.18)
    ax.set_xticks(x)
    names = [getattr(s, "stage", i) for i, s in enumerate(stages)]
    ax.set_xticklabels([f"stage {n}" if len(stages) <= 8 else str(n) for n in names])
    if len(stages) > 8:
        ax.set_xlabel("pipeline stage")
    ax.set_ylabel("memory per GPU (GiB)")
    peak = max(totals)
    fits = getattr(report, "fits", None)
    verdict = "fits" if (peak <= cap if fits is None else fits) else "DOES NOT FIT"
    ax.set_title(f"{spec.model.name}: memory per GPU by pipeline stage\n{_layout(spec)} | "
                 f"peak {peak:.1f} of {cap:.0f} GiB: {verdict}", fontsize=10)
    ax.grid(axis="y", color="#BBBBBB", linewidth=0.5, alpha=0.6)
    ax.set_axisbelow(True)
    fig.legend(loc="outside lower center", ncol=3, fontsize=8, frameon=False)
    return _save(fig, path)


def _layout(spec) -> str:
    p, t = spec.parallel, spec.train
    recompute = f", recompute {t.recompute_granularity}" if t.recompute_granularity else ""
    return (f"{spec.world_size} x {spec.cluster.hardware.name}, TP{p.tp} PP{p.pp} VPP{p.vpp} "
            f"CP{p.cp} EP{p.ep} DP{spec.dp}, MBS {t.micro_batch_size} "
            f"seq {t.seq_length} {t.precision}{recompute}")


__all__ = ("plot_timeline", "plot_memory", "plot_trials", "trial_point")
