"""The summary of a multirun sweep: one row per job, ranked, as CSV and as a table.

A job's result is what the app returned: ``Estimate.to_dict()`` for mode=project,
``{"verdict": "illegal", "error": ...}`` for a combination the specs reject, or
``{"verdict": "failed", "error": ...}`` for a job that raised. Ranking: jobs that fit
by tokens/s/GPU (highest first), then those that do not fit, then illegal and failed
ones, each in job order.

Pure: no Hydra here (the callback in ``sweep_callback`` feeds it).
"""
from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from primus_ext.util.files import atomic_write_text

GIB = 2**30
METRIC_COLUMNS = ("verdict", "step_time_s", "tokens_per_s_per_gpu", "tflops_per_gpu",
                  "mfu", "peak_memory_gib", "error")
_VERDICT_ORDER = {"fits": 0, "ok": 0, "oom": 1, "illegal": 2, "failed": 3}


@dataclass(frozen=True, kw_only=True, slots=True)
class JobResult:
    num: int  # Hydra's job number in the sweep
    overrides: tuple[str, ...]  # the job's overrides, as Hydra passed them
    result: Any  # the job's return value (a dict for the primus-ext app)
    extra: dict = field(default_factory=dict)  # columns a sweeper adds (e.g. projected)


def _number(x) -> float | None:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
        return None
    return float(x)


def verdict_of(result: Any) -> str:
    if not isinstance(result, dict):
        return "failed" if isinstance(result, BaseException) else "ok"
    if result.get("verdict"):
        return str(result["verdict"])
    fits = result.get("fits")
    return "ok" if fits is None else ("fits" if fits else "oom")


def summary_row(job: JobResult) -> dict:
    """The CSV row of one job (swept-key columns are added by ``summary_rows``)."""
    r = job.result if isinstance(job.result, dict) else {}
    peak = _number(r.get("peak_memory_bytes", r.get("peak_bytes")))
    error = r.get("error")
    if isinstance(job.result, BaseException):
        error = f"{type(job.result).__name__}: {job.result}"
    return {"job": job.num, "overrides": " ".join(job.overrides),
            "verdict": verdict_of(job.result),
            "step_time_s": _number(r.get("step_time_s")),
            "tokens_per_s_per_gpu": _number(r.get("tokens_per_s_per_gpu")),
            "tflops_per_gpu": _number(r.get("tflops_per_gpu")),
            "mfu": _number(r.get("mfu")),
            "peak_memory_gib": peak / GIB if peak is not None else None,
            "error": error, **job.extra}


def swept_keys(jobs: Sequence[JobResult]) -> list[str]:
    """Override keys whose value differs between jobs, in first-seen order."""
    values: dict[str, set] = {}
    for job in jobs:
        for ov in job.overrides:
            key, _, value = ov.partition("=")
            values.setdefault(key, set()).add(value)
    for job in jobs:  # a key missing from some jobs varies too
        keys = {ov.partition("=")[0] for ov in job.overrides}
        for key in values:
            if key not in keys:
                values[key].add(None)
    return [k for k, vals in values.items() if len(vals) > 1]


def summary_rows(jobs: Sequence[JobResult]) -> tuple[list[str], list[dict]]:
    """(columns, rows ranked best first) for the jobs of one sweep."""
    keys = swept_keys(jobs)
    rows = []
    for job in jobs:
        row = summary_row(job)
        given = dict(ov.partition("=")[::2] for ov in job.overrides)
        row.update({k: given.get(k) for k in keys})
        rows.append(row)
    rows.sort(key=lambda r: (_VERDICT_ORDER.get(r["verdict"], 4),
                             -(r["tokens_per_s_per_gpu"] or 0.0), r["job"]))
    for rank, row in enumerate(rows, 1):
        row["rank"] = rank
    extra = [k for job in jobs for k in job.extra]
    columns = (["rank", "job", "overrides", *keys, *METRIC_COLUMNS]
               + list(dict.fromkeys(k for k in extra if k not in METRIC_COLUMNS)))
    return columns, rows


def write_summary_csv(jobs: Sequence[JobResult], path) -> Path:
    columns, rows = summary_rows(jobs)
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, extrasaction="ignore",
                            lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: ("" if row.get(k) is None else row.get(k)) for k in columns})
    return atomic_write_text(path, buf.getvalue())


def print_summary(jobs: Sequence[JobResult], title: str, caption: str | None = None,
                  max_rows: int = 40) -> None:
    """The ranked table on the terminal (stdout): swept keys and the figures."""
    from primus_ext.emit.console import print_table

    _, rows = summary_rows(jobs)
    keys = swept_keys(jobs)
    extra = list(dict.fromkeys(k for job in jobs for k in job.extra))
    head = ["#", "job", *keys, "verdict", "step (s)", "tok/s/GPU", "MFU", "peak GiB",
            *extra]
    body = []
    for row in rows[:max_rows]:
        mfu = row["mfu"]
        peak = row["peak_memory_gib"]
        cells = (row["rank"], row["job"], *[row.get(k) for k in keys],
                 row["verdict"] + (f": {_clip(row['error'])}" if row["error"] else ""),
                 _num(row["step_time_s"], "{:.3f}"),
                 _num(row["tokens_per_s_per_gpu"], "{:,.0f}"),
                 None if mfu is None else f"{mfu:.1%}",
                 None if peak is None else f"{peak:.1f}", *[row.get(k) for k in extra])
        body.append(tuple("-" if c is None else c for c in cells))
    if len(rows) > max_rows:
        more = f"{len(rows) - max_rows} more rows in the CSV"
        caption = f"{caption}; {more}" if caption else more
    print_table(title, head, body, caption=caption)


def _num(x: float | None, spec: str) -> str | None:
    return None if x is None else spec.format(x)


def _clip(text: str, width: int = 70) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= width else text[:width - 3] + "..."
