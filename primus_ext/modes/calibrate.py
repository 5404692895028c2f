"""mode=calibrate: fit each hardware preset's physical constants to measured runs.

Writes the calibration (``out=``, default: the committed default file) and prints a
leave-one-source-out report: for every source, fit on the other sources and predict it.
"""
from __future__ import annotations

from primus_ext.emit.console import print_json, print_table
from primus_ext.modes.validate import runs_path
from primus_ext.project.calibration import DEFAULT_PATH, save_calibration
from primus_ext.project.estimate import project
from primus_ext.project.fit import fit
from primus_ext.project.validate import percentile, project_run
from primus_ext.published import read_runs


def _uncalibrated(spec):
    return project(spec, calibration=None)


def held_out_results(runs, warm=None) -> list:
    """Every row projected by constants fitted on all the other sources (RowResult per
    row, in the order of ``runs``). ``warm``: the all-source calibration to start each
    refit from (same optimum, fewer steps)."""
    by_id = {}
    for source in sorted({r.source for r in runs}):
        train = [r for r in runs if r.source != source]
        calib = fit(train, _uncalibrated, warm=warm).calibration
        for r in runs:
            if r.source == source:
                by_id[id(r)] = project_run(r, calib)
    return [by_id[id(r)] for r in runs]


def leave_one_source_out(runs, warm=None, results=None
                         ) -> tuple[list[tuple[str, int, float]], list[float]]:
    """Per source (source, rows, median |error|) predicting it from a fit on the other
    sources, and every held-out row's |error| (``results``: held_out_results, if known)."""
    results = held_out_results(runs, warm) if results is None else results
    per_source, every = [], []
    for source in sorted({r.source for r in results}):
        errs = [abs(r.rel_error) for r in results
                if r.source == source and r.rel_error is not None]
        if errs:
            per_source.append((source, len(errs), percentile(errs, 50)))
            every += errs
    return per_source, every


def run(cfg) -> dict:
    runs = read_runs(runs_path(cfg))
    report = fit(runs, _uncalibrated)
    path = cfg.get("out") or DEFAULT_PATH
    save_calibration(report.calibration, path)
    loso, held_errs = (leave_one_source_out(runs, warm=report.calibration)
                       if cfg.get("loso", True) else ([], []))
    loso_median = percentile(held_errs, 50) if held_errs else None
    out = {"calibration": str(path), "hardware": report.per_hardware,
           "leave_one_source_out": [{"source": s, "rows": n, "median_abs_error": m}
                                    for s, n, m in loso],
           "leave_one_source_out_median": loso_median}
    if cfg.output == "json":
        print_json(out)
        return out
    print_table("fitted constants per hardware", ["hardware", "rows", "msle before",
                "msle after", "constants"],
                [(name, v["rows"], v["msle_before"], v["msle_after"],
                  ", ".join(f"{k}={v[k]}" for k in v if k not in
                            ("rows", "msle_before", "msle_after")))
                 for name, v in report.per_hardware.items()],
                caption=f"written to {path}")
    if loso:
        print_table("leave-one-source-out (fit without a source, predict it)",
                    ["source", "rows", "median |error|"],
                    [(s, n, f"{m:.1%}") for s, n, m in loso],
                    caption=f"median |error| over all held-out rows: {loso_median:.1%}")
    return out
