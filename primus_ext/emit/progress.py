"""The tuner's progress bar (rich, on stderr: stdout stays one JSON object with output=json)."""
from __future__ import annotations

import sys
import time


class TuneProgress:
    """Candidates evaluated against the budget, and the best so far."""

    def __init__(self, settings, total: int, stream=None):
        self.settings, self.total = settings, total
        self.stream = stream or sys.stderr
        self._progress = None
        self._task = None
        self._last = 0.0

    def start(self, headline: str | None = None) -> None:
        from rich.console import Console
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                                   TimeElapsedColumn)

        console = Console(file=self.stream, stderr=self.stream is sys.stderr)
        if headline:
            console.print(f"[bold]primus-ext tune[/bold]: {headline}")
        self._progress = Progress(TextColumn("evaluated"), BarColumn(bar_width=20),
                                  MofNCompleteColumn(), TimeElapsedColumn(),
                                  TextColumn("{task.fields[best]}"), console=console,
                                  transient=False)
        self._task = self._progress.add_task("tune", total=self.total, best="")
        self._progress.start()

    def update(self, ev) -> None:
        if self._progress is None:
            return
        now = time.monotonic()
        self._last_ev = ev
        if now - self._last < 0.1:  # redraw at most ten times a second
            return
        self._last = now
        self._refresh(ev)

    def _refresh(self, ev) -> None:
        best = ev.best
        text = ""
        if best is not None:
            m = best.metrics
            text = (f"best {m['tokens_per_s_per_gpu']:,.0f} tok/s/GPU "
                    f"({m['step_time_s']:.3f} s, MFU {m['mfu']:.1%})")
        rejected = sum(ev.rejected.values())
        self._progress.update(self._task, completed=min(ev.num_checked, self.total),
                              best=f"{text} | rejected {rejected:,}")

    def stop(self) -> None:
        if self._progress is not None:
            ev = getattr(self, "_last_ev", None)
            if ev is not None:
                self._refresh(ev)
            self._progress.stop()
            self._progress = None
