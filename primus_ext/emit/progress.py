"""The tuner's progress bar (rich, on stderr: stdout stays one JSON object with output=json).

On a terminal a live bar shows candidates evaluated against the budget and the best so
far; when stderr is a file or a pipe, one line at the start and one at the end.
"""
from __future__ import annotations

import sys
import time


def _best_text(ev) -> str:
    best = ev.best
    if best is None:
        return "nothing fits yet"
    m = best.metrics
    return (f"best {m['tokens_per_s_per_gpu']:,.0f} tok/s/GPU ({m['step_time_s']:.3f} s, "
            f"MFU {m['mfu']:.1%})")


class TuneProgress:
    """Candidates evaluated against the budget, and the best so far."""

    def __init__(self, settings, total: int, stream=None):
        self.settings, self.total = settings, total
        self.stream = stream or sys.stderr
        self._progress = None
        self._task = None
        self._last = 0.0
        self._ev = None
        self._console = None

    def start(self, headline: str | None = None) -> None:
        from rich.console import Console

        self._console = Console(file=self.stream, highlight=False)
        if headline:
            self._console.print(f"primus-ext tune: {headline}")
        if not self._console.is_terminal:
            return
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                                   TimeElapsedColumn)
        self._progress = Progress(TextColumn("evaluated"), BarColumn(bar_width=20),
                                  MofNCompleteColumn(), TimeElapsedColumn(),
                                  TextColumn("{task.fields[best]}"), console=self._console)
        self._task = self._progress.add_task("tune", total=self.total, best="")
        self._progress.start()

    def update(self, ev) -> None:
        self._ev = ev
        if self._progress is None:
            return
        now = time.monotonic()
        if now - self._last < 0.1:  # redraw at most ten times a second
            return
        self._last = now
        self._refresh(ev)

    def _refresh(self, ev) -> None:
        rejected = sum(ev.rejected.values())
        self._progress.update(self._task, completed=min(ev.num_checked, self.total),
                              best=f"{_best_text(ev)} | rejected {rejected:,}")

    def stop(self) -> None:
        ev = self._ev
        if self._progress is not None:
            if ev is not None:
                self._refresh(ev)
            self._progress.stop()
            self._progress = None
        elif self._console is not None and ev is not None:
            self._console.print(f"primus-ext tune: evaluated {ev.num_checked:,} "
                                f"({ev.num_projected:,} projected, "
                                f"{sum(ev.rejected.values()):,} rejected) in "
                                f"{ev.elapsed_s:.1f} s; {_best_text(ev)}")
