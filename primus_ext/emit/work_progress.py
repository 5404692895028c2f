"""Progress of long work on stderr (stdout stays one JSON object with output=json).

On a terminal, rich's live bar with the rate; when stderr is a file or a pipe, one line
every ``every_s`` seconds and one at the end, so a log shows the work is moving.
"""
from __future__ import annotations

import sys
import time


class WorkProgress:
    """``done`` of ``total`` items (rows, steps) of one labelled piece of work."""

    def __init__(self, label: str, total: int, unit: str = "rows", stream=None,
                 every_s: float = 10.0):
        self.label, self.total, self.unit, self.every_s = label, total, unit, every_s
        self.stream = stream or sys.stderr
        self.done = 0
        self._t0 = self._last = time.monotonic()
        self._bar = self._task = None

    def __enter__(self) -> "WorkProgress":
        if getattr(self.stream, "isatty", lambda: False)():
            from rich.console import Console
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                                       TimeElapsedColumn)
            self._bar = Progress(TextColumn(f"primus-ext {self.label}"), BarColumn(),
                                 MofNCompleteColumn(), TextColumn(self.unit),
                                 TimeElapsedColumn(), TextColumn("{task.fields[rate]}"),
                                 console=Console(file=self.stream), transient=True)
            self._task = self._bar.add_task(self.label, total=self.total, rate="")
            self._bar.start()
        return self

    def advance(self, n: int = 1) -> None:
        self.done += n
        now = time.monotonic()
        if self._bar is not None:
            if now - self._last >= 0.1 or self.done == self.total:
                self._last = now
                self._bar.update(self._task, completed=self.done, rate=self._rate(now))
        elif now - self._last >= self.every_s:
            self._last = now
            self._line(now)

    def _rate(self, now: float) -> str:
        return f"{self.done / max(now - self._t0, 1e-9):,.0f} {self.unit}/s"

    def _line(self, now: float) -> None:
        print(f"primus-ext {self.label}: {self.done:,} of {self.total:,} {self.unit} "
              f"({self._rate(now)}, {now - self._t0:.0f} s)", file=self.stream, flush=True)

    def __exit__(self, *exc) -> None:
        now = time.monotonic()
        if self._bar is not None:
            self._bar.stop()
        if now - self._t0 >= 2.0 or self._bar is None and self.done >= 1000:
            self._line(now)
