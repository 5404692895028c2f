"""A published-runs CSV read whole: every row through ``reader.parse_row``, rows that
repeat a configuration under another run_id parsed once, file-level errors (no such
file, not UTF-8, no run_id column, a run_id twice) as one ValueError naming the file."""
from __future__ import annotations

import csv
from dataclasses import replace
from pathlib import Path
from typing import Mapping

from primus_ext.published.reader import DEFAULT_PATH, PublishedRun, parse_row
from primus_ext.util.files import input_file

def _parse_shared(row: Mapping[str, str | None], line: int, parsed: dict) -> PublishedRun:
    """``parse_row``, shared between rows that differ only in their run_id (a large CSV
    repeats configurations): parsed once, then relabelled."""
    run_id = (row.get("run_id") or "").strip() or f"line {line}"
    key = tuple(sorted((k, v) for k, v in row.items() if k != "run_id" and k is not None))
    first = parsed.get(key)
    if first is None:
        first = parsed[key] = parse_row(row, line)
        return first
    old, new = f"row {first.run_id}", f"row {run_id}"
    return replace(first, run_id=run_id, row=dict(row),
                   error=first.error.replace(old, new) if first.error else first.error,
                   notes=tuple(n.replace(old, new) for n in first.notes))


def read_runs(path: str | Path = DEFAULT_PATH, on_row=None) -> list[PublishedRun]:
    """Every row of a published-runs CSV (measured_* columns may be absent); ``on_row()``
    is called after each row (progress).

    File-level errors (no such file, not UTF-8 text, no run_id column, a run_id on two
    rows) raise one ValueError naming the file; a bad row becomes that row's error."""
    path = input_file(path, "runs")
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            reader = csv.DictReader(f)
            if not reader.fieldnames or "run_id" not in reader.fieldnames:
                raise ValueError(f"runs={str(path)!r}: not a published-runs CSV (no "
                                 "'run_id' column in the header)")
            runs, lines, parsed = [], {}, {}
            for row in reader:
                run = _parse_shared(row, reader.line_num, parsed)
                key = (row.get("run_id") or "").strip()
                if key and key in lines:
                    raise ValueError(f"runs={str(path)!r}: run_id {key!r} appears twice "
                                     f"(lines {lines[key]} and {reader.line_num}); each row "
                                     "needs its own run_id")
                lines[key] = reader.line_num
                runs.append(run)
                if on_row is not None:
                    on_row()
            return runs
    except UnicodeDecodeError as exc:
        raise ValueError(f"runs={str(path)!r} is not UTF-8 text (byte {exc.start}: "
                         f"{exc.reason}); save it as a UTF-8 CSV") from None
    except csv.Error as exc:
        raise ValueError(f"runs={str(path)!r}: not a readable CSV ({exc})") from None
