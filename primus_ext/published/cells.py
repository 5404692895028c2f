"""Cell parsing of published-run rows: one RowError per bad cell, naming row and column."""
from __future__ import annotations

from typing import Mapping


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
        try:
            number = float(value)
        except ValueError:
            raise self.fail(column, f"{value!r} is not an integer") from None
        if number != int(number):
            raise self.fail(column, f"{value!r} is not an integer")
        return int(number)

    def float_(self, column: str) -> float | None:
        value = self.text(column)
        if not value:
            return None
        try:
            return float(value)
        except ValueError:
            raise self.fail(column, f"{value!r} is not a number") from None
