"""mode=validate: project every row of a published-runs CSV and report the errors.

Writes ``out=`` (one row per input row) when given; prints per-row errors and the
median / 90th-percentile absolute error of tokens/s/GPU overall, per GPU kind, dense vs
MoE and per precision when measured columns exist.
"""
from __future__ import annotations

import csv
import io

from primus_ext.emit.console import gib, print_json, print_table
from primus_ext.project.calibration import load_calibration
from primus_ext.project.validate import project_run, summarize
from primus_ext.published import DEFAULT_PATH, read_runs
from primus_ext.util.files import atomic_write_text, output_path

COLUMNS = ("run_id", "tokens_per_s_per_gpu", "tokens_per_s_per_gpu_low",
           "tokens_per_s_per_gpu_high", "step_time_s", "tflops_per_gpu", "mfu",
           "peak_memory_gib", "fits", "error", "measured_tokens_per_s_per_gpu",
           "rel_error")


# Rows printed in the per-row table (a 100,000-row CSV would take minutes to draw); the
# summary covers every row, and out= / output=json list them all.
MAX_TABLE_ROWS = 200


def runs_path(cfg):
    runs = cfg.get("runs") or "default"
    if runs == "golden":
        from primus_ext.published.golden import DEFAULT_PATH as GOLDEN
        return GOLDEN
    return DEFAULT_PATH if runs == "default" else runs


def load_runs(path) -> list:
    """Published-run records: a CSV in the published format, or Megatron-LM's golden
    values (a ``.json`` written by scripts/golden_dataset.py; ``runs=golden``)."""
    if str(path).endswith(".json"):
        from primus_ext.published.golden import as_runs, read_golden
        return as_runs(read_golden(path, timed_only=True))
    from primus_ext.emit.work_progress import WorkProgress
    from primus_ext.util.files import input_file
    with open(input_file(path, "runs"), "rb") as f:  # rows, for the progress line
        lines = sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))
    with WorkProgress("validate: reading", max(lines - 1, 1)) as progress:
        return read_runs(path, on_row=progress.advance)


def validate(path, calibration="default"):
    """Every row projected; rows that share a configuration share one projection."""
    from primus_ext.emit.work_progress import WorkProgress
    from primus_ext.project.estimate import project

    calib = load_calibration(calibration)
    runs = load_runs(path)
    cache: dict = {}

    def shared(spec, calibration):
        key = id(spec)  # identical parsed rows hand over the same spec object (kept alive by runs)
        if key not in cache:
            try:
                cache[key] = (project(spec, calibration=calibration), None)
            except ValueError as exc:
                cache[key] = (None, exc)
        est, exc = cache[key]
        if exc is not None:
            raise exc
        return est

    results = []
    with WorkProgress("validate", len(runs)) as progress:
        for run in runs:
            results.append(project_run(run, calib, shared))
            progress.advance()
    return results


def row_dict(r) -> dict:
    e = r.estimate
    band = r.band["tokens_per_s_per_gpu"] if e else None
    return {
        "run_id": r.run_id,
        "tokens_per_s_per_gpu": round(e.tokens_per_s_per_gpu, 2) if e else "",
        "tokens_per_s_per_gpu_low": round(band["low"], 2) if band else "",
        "tokens_per_s_per_gpu_high": round(band["high"], 2) if band else "",
        "step_time_s": round(e.step_time_s, 5) if e else "",
        "tflops_per_gpu": round(e.tflops_per_gpu, 2) if e else "",
        "mfu": round(e.mfu, 4) if e else "",
        "peak_memory_gib": round(gib(e.peak_memory_bytes), 2) if e else "",
        "fits": e.fits if e else "",
        "error": r.error or "",
        "measured_tokens_per_s_per_gpu": (round(r.measured_tokens_per_s_per_gpu, 2)
                                          if r.measured_tokens_per_s_per_gpu else ""),
        "rel_error": round(r.rel_error, 4) if r.rel_error is not None else "",
    }


def write_csv(results, out) -> None:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=COLUMNS)
    w.writeheader()
    for r in results:
        w.writerow(row_dict(r))
    atomic_write_text(out, buf.getvalue(), "out")


def run(cfg) -> dict:
    if cfg.get("out"):
        output_path(cfg.out, "out")  # fail before the work, not after it
    results = validate(runs_path(cfg), cfg.get("calibration", "default"))
    if cfg.get("out"):
        write_csv(results, cfg.out)
    summary = summarize(results)
    out = {"rows": [row_dict(r) for r in results],
           "summary": [{"group": g, "rows": n, "median_abs_error": med, "p90_abs_error": p90}
                       for g, n, med, p90 in summary]}
    if cfg.output == "json":
        print_json(out)
        _check_projected(cfg, results)
        return out
    shown = results[:MAX_TABLE_ROWS]
    more = len(results) - len(shown)
    print_table("projected vs measured tokens/s/GPU",
                ["run", "gpu", "model", "projected", "80% band", "measured", "error",
                 "note"],
                [(r.run_id, r.gpu, r.model,
                  r.estimate.tokens_per_s_per_gpu if r.estimate else None,
                  _band_cell(r),
                  r.measured_tokens_per_s_per_gpu,
                  f"{r.rel_error:+.1%}" if r.rel_error is not None else "",
                  (r.error or ({"tflops": "from TFLOP/s", "mfu": "from MFU"}.get(r.measured_from, "")))[:60])
                 for r in shown],
                caption=(f"the first {len(shown):,} of {len(results):,} rows; "
                         + (f"all of them in out={cfg.out}" if cfg.get("out") else
                            "out=FILE.csv or output=json gives every row")) if more else None)
    print_table("absolute error of tokens/s/GPU", ["group", "rows", "median", "p90"],
                [(g, n, f"{med:.1%}", f"{p90:.1%}") for g, n, med, p90 in summary])
    _check_projected(cfg, results)
    return out


def _band_cell(r) -> str:
    if r.estimate is None:
        return ""
    b = r.band["tokens_per_s_per_gpu"]
    return f"{b['low']:,.0f}-{b['high']:,.0f}"


def _check_projected(cfg, results) -> None:
    """Exit non-zero (after the table) when not one row could be projected."""
    if any(r.estimate is not None for r in results):
        return
    first = next((r.error for r in results if r.error), None)
    raise ValueError(f"runs={str(runs_path(cfg))!r}: none of its {len(results)} row(s) could "
                     "be projected" + (f"; first error: {first}" if first else ""))
