"""Cell parsing of published-run rows: one RowError per bad cell, naming row and column."""
from __future__ import annotations

import math
import re
from typing import Mapping

_INTEGER = re.compile(r"[+]?[0-9]+")


class RowError(ValueError):
    """A row that cannot become a RunSpec; the message names the row and column."""


class _Row:
    def __init__(self, row: Mapping[str, str | None], run_id: str):
        self.row, self.run_id = row, run_id

    def fail(self, column: str, msg: str) -> RowError:
        return RowError(f"row {self.run_id}: column {column!r}: {msg}")

    def text(self, column: str, required: bool = False) -> str:
        value = self.row.get(column)
        if value is None:
            if required:
                raise self.fail(column, "missing (no such column in this row)")
            return ""
        value = value.strip()
        if required and not value:
            raise self.fail(column, "is empty; it is required")
        return value

    def int_(self, column: str, required: bool = False) -> int | None:
        value = self.text(column, required)
        if not value or value.lower() in ("n/a", "na", "-"):
            if required:
                raise self.fail(column, f"{value!r} is not an integer")
            return None
        # Whole numbers in decimal digits only: '1e3' or '8.0' in a count is more likely
        # a column mix-up or a spreadsheet's rewrite than a count, so it is refused
        # (one rule for every integer column) rather than read as 1000 or 8.
        if not _INTEGER.fullmatch(value):
            raise self.fail(column, f"{value!r} is not an integer (write it in digits, "
                                    "e.g. 1024)")
        return int(value)

    def float_(self, column: str, positive: bool = False) -> float | None:
        """A number; ``positive``: a measured figure, which must be finite and > 0."""
        value = self.text(column)
        if not value:
            return None
        try:
            number = float(value)
        except ValueError:
            raise self.fail(column, f"{value!r} is not a number") from None
        if not math.isfinite(number):
            raise self.fail(column, f"{value!r} is not a finite number")
        if positive and number <= 0:
            raise self.fail(column, f"{value!r} must be positive (a measured figure)")
        return number
