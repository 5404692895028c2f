"""What the pictures share: colours, the Agg backend, atomic PNG writes."""
from __future__ import annotations

from pathlib import Path

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


def pyplot():
    """matplotlib.pyplot on the Agg backend (no display), imported on first use."""
    import matplotlib
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt
    return plt


def save_png(fig, path) -> Path:
    """Write ``fig`` to ``path`` as PNG (atomically: a temp file with a unique name, then a
    rename; two writers of one path never share a temp file)."""
    import io

    from primus_ext.util.files import atomic_write_bytes

    buf = io.BytesIO()
    try:
        fig.savefig(buf, dpi=120, bbox_inches="tight", format="png")
    finally:
        pyplot().close(fig)
    return atomic_write_bytes(path, buf.getvalue(), "plot")
