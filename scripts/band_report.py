"""The error-band section of docs/accuracy.md: how often the measured value fell inside
its 80 % band on the public set held out.

Honest by construction: each public row's residual is leave-one-source-out (its source
was not fitted), and its band comes from a table rebuilt without any row of its source
(project/band_fit.py ``held_out_coverage``). The table's other rows: the other sources'
held-out residuals and the
host-bound golden cases' leave-one-family-out residuals as committed in
data/bands/default.json (scripts/band_data.py). Used by scripts/accuracy_report.py.
"""
from __future__ import annotations

import json

from primus_ext.project import bands
from primus_ext.project.band_fit import held_out_coverage, layout_correlation
from primus_ext.project.validate import percentile
from scripts.band_data import residual_rows


def _pct(x: float) -> str:
    return f"{x:.1%}"


def band_rows(held, runs) -> list[dict]:
    """Fresh public residual rows, the committed golden ones."""
    committed = json.loads(bands.DEFAULT_PATH.read_text())
    rows = residual_rows(held, runs, "public")
    rows += [r for r in committed["rows"] if r["set"] == "golden"]
    return rows


def _line(name: str, cov: list[dict]) -> str:
    inside = sum(c["inside"] for c in cov) / len(cov)
    widths = [c["half_width"] for c in cov]
    return (f"| {name} | {len(cov)} | {_pct(inside)} | {_pct(percentile(widths, 50))} | "
            f"{_pct(percentile(widths, 90))} |")


def band_section(held, runs) -> list[str]:
    rows = band_rows(held, runs)
    committed = json.loads(bands.DEFAULT_PATH.read_text())
    cov = held_out_coverage(rows, committed["min_rows"])
    feats = {r["run_id"]: r for r in rows if r["set"] == "public"}
    fresh = {r["run_id"]: r["ratio"] for r in rows if r["set"] == "public"}
    stale = [r["run_id"] for r in committed["rows"] if r["set"] == "public"
             and abs(fresh.get(r["run_id"], 0.0) - r["ratio"]) > 1e-3]
    corr = layout_correlation(rows)
    lines = ["## Error bands: the measured value against its 80% band", "",
             "Every projection carries an 80% band of tokens/s/GPU and step time "
             "(`error_band` in the projection JSON, `tokens_per_s_per_gpu_low` / `_high` "
             "in `mode=validate`'s CSV; `primus_ext/project/bands.py`): the 10th to 90th "
             "percentile of measured / projected over held-out residuals of comparable "
             "runs, grouped by dense/MoE, GPU generation, GPU count (1-8, 9-64, 65-512, "
             f">512), host-bound share (>= {bands.HOST_BOUND_SHARE:.0%} of the step is "
             "the host's: `host_s`) and whether the source published the recompute "
             f"setting or the reader inferred it; a group of fewer than "
             f"{committed['min_rows']} rows, or from fewer than "
             f"{committed.get('min_sources', 1)} sources, falls back to a wider one (features dropped "
             f"in the order {', '.join(committed['drop_order'])}). Residuals: the public "
             "set leave-one-source-out and the "
             "golden cases leave-one-family-out (host-bound groups only).", "",
             "Held out: each public row's residual comes from constants fitted without "
             "its source, and its band from a table rebuilt without any row of its "
             "source. Target (issue 25): 70-95% of rows inside, median half-width at "
             "most 20% of the projection.", "",
             "| rows | count | inside band | median half-width | p90 half-width |",
             "| --- | ---: | ---: | ---: | ---: |", _line("all public rows", cov)]
    for f in ("arch", "hardware", "scale", "recompute"):
        for value in sorted({feats[c["run_id"]][f] for c in cov}):
            part = [c for c in cov if feats[c["run_id"]][f] == value]
            lines.append(_line(f"{f}={value}", part))
    lines += ["", f"Layouts of one job err alike: over {corr['jobs']} jobs the public "
              f"set publishes in several layouts ({corr['rows']} rows), "
              f"the log errors correlate at rho {corr['rho']:.2f} (committed: "
              f"{committed['rho']:.2f}); the tuner calls two layouts tied when their "
              "difference lies inside the band of that difference.", "",
              "The committed band table (`primus_ext/data/bands/default.json`, "
              "`scripts/band_data.py --write`), all rows:", "",
              "| group | rows | low | high |", "| --- | ---: | ---: | ---: |"]
    for key, g in sorted(committed["groups"].items(), key=lambda kv: (-kv[0].count(","),
                                                                       kv[0])):
        lines.append(f"| {key} | {g['rows']} | {g['low']:.3f} | {g['high']:.3f} |")
    if stale:
        lines += ["", f"The committed band file predates this calibration ({len(stale)} "
                  "public residuals differ): regenerate it with `scripts/band_data.py "
                  "--write`."]
    return lines
