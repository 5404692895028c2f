"""The tuner's candidates in one picture: tokens/s/GPU against peak memory per GPU.

Projected candidates are points; candidates the memory model rejected before projection
(no throughput, only a peak) are ticks along the bottom of the axes at their peak; the
winner (star) and the baseline (diamond) are marked, with their layouts in the legend
below the axes, where long labels cannot cover points.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

from primus_ext.emit.plot_style import COLOURS, GIB, pyplot, save_png


def _field(obj: Any, *names: str, default=None):
    for name in names:
        if isinstance(obj, dict):
            if obj.get(name) is not None:
                return obj[name]
        elif getattr(obj, name, None) is not None:
            return getattr(obj, name)
    return default


def trial_point(trial) -> dict | None:
    """What the plot needs from one trial: the tuner's Trial (figures in ``metrics``),
    a journal record (figures in ``estimate``), an ``Estimate.to_dict()``, or an object
    with the same names. ``tps`` is None for a candidate rejected before projection;
    None for a trial with neither throughput nor memory (illegal, skipped)."""
    est = _field(trial, "estimate", "metrics", default=trial)
    tps = _field(est, "tokens_per_s_per_gpu")
    mem = _field(est, "peak_memory_bytes")
    mem_gib = mem / GIB if mem is not None else _field(est, "peak_memory_gib")
    if mem_gib is None:
        return None
    device = _field(est, "device_bytes")
    fits = _field(est, "fits", default=_field(trial, "fits"))
    if fits is None:
        verdict = _field(trial, "verdict")
        fits = verdict != "oom" if verdict is not None else (
            device is None or mem_gib * GIB <= device)
    return {"tps": None if tps is None else float(tps), "mem_gib": float(mem_gib),
            "fits": bool(fits), "label": _label(trial),
            "device_gib": device / GIB if device else None, "hardware": _hardware(trial)}


def _hardware(trial) -> str | None:
    """The GPU a candidate is for (multi-cluster tuning: each carries its cluster)."""
    cand = _field(trial, "candidate")
    if isinstance(cand, dict) and cand.get("hardware") is not None:
        return str(cand["hardware"])
    est = _field(trial, "estimate", "metrics", default=trial)
    hw = _field(est, "hardware")
    return None if hw is None else str(hw)


# One colour per GPU kind when the candidates span several.
_KIND_COLOURS = ("#4C72B0", "#C44E52", "#55A868", "#8172B3", "#937860", "#DA8BC3")


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
    """Write the picture of ``trials`` to ``path`` (PNG). ``device_gib`` draws the
    device's capacity (default: the ``device_bytes`` the tuner's records carry)."""
    plt = pyplot()
    points = [pt for pt in (trial_point(t) for t in trials) if pt is not None]
    scored = [p for p in points if p["tps"] is not None]
    rejected = [p for p in points if p["tps"] is None]
    # Per GPU kind: its capacity (the device_bytes its own records carry).
    capacity: dict = {}
    for p in points:
        if p["device_gib"] and p["hardware"] not in capacity:
            capacity[p["hardware"]] = p["device_gib"]
    if device_gib is not None:
        capacity = {None: device_gib}
    kinds = list(dict.fromkeys(p["hardware"] for p in points))
    per_kind = len(kinds) > 1
    device_gib = max(capacity.values(), default=None)
    marked = [(trial_point(t) if t is not None else None, marker, colour, name)
              for t, marker, colour, name in ((baseline, "D", "#333333", "baseline"),
                                              (winner, "*", "#E1A100", "winner"))]
    shown = [p for p in scored] + [m[0] for m in marked if m[0] and m[0]["tps"]]
    # The x axis spans what was projected and the device; a rejected candidate further
    # out is counted in the legend, not drawn (one 900 GiB layout would squash the rest).
    xmax = 1.1 * max([p["mem_gib"] for p in shown] + [device_gib or 0.0] + [1.0])
    top = max([p["tps"] for p in shown] + [1.0])

    fig, ax = plt.subplots(figsize=(8, 6), layout="constrained")
    fit = [p for p in scored if p["fits"]]
    over = [p for p in scored if not p["fits"]]  # projected anyway (e.g. a sweep's rows)
    if fit and per_kind:
        for i, kind in enumerate(kinds):
            mine = [p for p in fit if p["hardware"] == kind]
            if mine:
                ax.scatter([p["mem_gib"] for p in mine], [p["tps"] for p in mine], s=22,
                           color=_KIND_COLOURS[i % len(_KIND_COLOURS)], alpha=0.7,
                           label=f"{kind}: projected, fits ({len(mine)})")
    elif fit:
        ax.scatter([p["mem_gib"] for p in fit], [p["tps"] for p in fit], s=22,
                   color=COLOURS["forward"], alpha=0.7, label=f"projected, fits ({len(fit)})")
    if over:
        ax.scatter([p["mem_gib"] for p in over], [p["tps"] for p in over], s=22,
                   facecolors="none", edgecolors="#888888",
                   label=f"projected, does not fit ({len(over)})")
    if rejected:
        inside = [p["mem_gib"] for p in rejected if p["mem_gib"] <= xmax]
        beyond = len(rejected) - len(inside)
        more = f", {beyond} beyond {xmax:.0f} GiB" if beyond else ""
        ax.scatter(inside, [0.0] * len(inside), marker="|", s=160, color="#888888",
                   clip_on=False, zorder=3,
                   label=f"rejected by memory, at their peak ({len(rejected)}{more})")
    for kind, gib in capacity.items():
        colour = (_KIND_COLOURS[kinds.index(kind) % len(_KIND_COLOURS)]
                  if per_kind and kind in kinds else COLOURS["device"])
        name = f"{kind} capacity" if per_kind and kind else "device capacity"
        ax.axvline(gib, color=colour, linestyle="--", linewidth=1.2,
                   label=f"{name} ({gib:.0f} GiB)")
    for pt, marker, colour, name in marked:
        if pt is None:
            continue
        detail = f"\n{_wrap(pt['label'])}" if pt["label"] else ""
        if per_kind and pt["hardware"]:
            detail = f" on {pt['hardware']}{detail}"
        if pt["tps"] is None:  # e.g. the user's own layout did not fit
            label = f"{name}: does not fit ({pt['mem_gib']:.1f} GiB){detail}"
            y = 0.0
        else:
            label = f"{name}: {pt['tps']:,.0f} tok/s/GPU, {pt['mem_gib']:.1f} GiB{detail}"
            y = pt["tps"]
        x = min(pt["mem_gib"], xmax)
        ax.scatter([x], [y], marker=marker, s=220 if marker == "*" else 90, color=colour,
                   edgecolors="black", linewidths=0.8, zorder=5, clip_on=False,
                   label=label)
        ax.annotate(name, (x, y), xytext=(8, 8), textcoords="offset points", fontsize=8,
                    fontweight="bold", color=colour, zorder=6, annotation_clip=False)
    ax.set_xlabel("peak memory per GPU (GiB)")
    ax.set_ylabel("tokens/s/GPU")
    ax.set_title(title or f"tuner candidates: {len(scored)} projected, {len(rejected)} "
                          "rejected by memory", fontsize=10)
    ax.grid(color="#BBBBBB", linewidth=0.5, alpha=0.6)
    ax.set_axisbelow(True)
    ax.set_xlim(0, xmax)
    ax.set_ylim(0, top * 1.12)
    if points or any(m[0] for m in marked):
        fig.legend(loc="outside lower center", ncol=2, fontsize=8, frameon=False)
    return save_png(fig, path)


def _wrap(label: str, width: int = 48) -> str:
    """Wrap a long label of space-separated words onto lines of about ``width``."""
    lines, line = [], ""
    for word in label.split():
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}".strip()
    lines.append(line)
    return "\n".join(lines[:4])
