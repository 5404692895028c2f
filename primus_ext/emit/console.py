"""Terminal output: one JSON object on stdout, or readable tables (rich)."""
from __future__ import annotations

import json
import sys
from typing import Any, Iterable, Sequence

from primus_ext.util.values import json_safe


def print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(json_safe(obj), indent=2) + "\n")
    sys.stdout.flush()


def print_table(title: str, columns: Sequence[str], rows: Iterable[Sequence[Any]],
                caption: str | None = None) -> None:
    """A table under its title, its caption below. Title and caption are plain lines
    that never wrap (a path in them stays whole); off a terminal (a pipe, a file) the
    table is as wide as its content instead of the 80 columns rich assumes there."""
    from rich.console import Console
    from rich.table import Table

    table = Table()
    for i, col in enumerate(columns):
        table.add_column(col, justify="left" if i == 0 else "right")
    for row in rows:
        table.add_row(*[fmt(v) for v in row])
    console = Console(width=None if sys.stdout.isatty() else 10_000, highlight=False)
    console.print(title, style="bold", soft_wrap=True, markup=False)
    console.print(table)
    if caption:
        console.print(caption, soft_wrap=True, markup=False)


def fmt(v: Any) -> str:
    if isinstance(v, bool) or v is None:
        return str(v)
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        if v == 0:
            return "0"
        if abs(v) >= 1000:
            return f"{v:,.0f}"
        if abs(v) >= 1:  # at most 3 decimals, no trailing zeros: 714.55, 14.766, 2
            return f"{v:.3f}".rstrip("0").rstrip(".")
        return f"{v:.4g}"
    return str(v)


def gib(num_bytes: float) -> float:
    return num_bytes / 2**30
