"""Fitting the error-band table from residual rows (pure; used by scripts/band_data.py,
scripts/accuracy_report.py and the tests).

A residual row is a dict: ``run_id``, ``set`` (public, golden), ``source``,
``job`` and ``layout`` (what makes two rows two layouts of one job), the features of
project/bands.py and ``ratio`` (measured / projected tokens/s/GPU of a run the
projector's constants were not fitted on).
"""
from __future__ import annotations

import math

from primus_ext.project import bands


def _log_width(ratios: list[float]) -> float:
    return math.log(bands.predictive_quantile(ratios, bands.HIGH_Q)
                    / bands.predictive_quantile(ratios, bands.LOW_Q))


def drop_order(rows: list[dict], min_rows: int = bands.MIN_ROWS) -> tuple[str, ...]:
    """Features by how little splitting on each alone narrows the bands (row-weighted
    mean log width of its groups of >= min_rows, small groups counted at the overall
    width), least first: those are dropped first."""
    overall = _log_width([r["ratio"] for r in rows])
    score = {}
    for f in bands.FEATURES:
        groups: dict[str, list[float]] = {}
        for r in rows:
            groups.setdefault(r[f], []).append(r["ratio"])
        total = sum(len(v) * (_log_width(v) if len(v) >= min_rows else overall)
                    for v in groups.values())
        score[f] = total / len(rows) - overall  # negative: the split narrows the bands
    return tuple(sorted(bands.FEATURES, key=lambda f: (-score[f], f)))


def layout_correlation(rows: list[dict]) -> dict:
    """rho = 1 - E[(e_a - e_b)^2] / (2 var e) over pairs of layouts of one job (e: log
    ratio; each job weighted once), clipped to [0, 0.95]."""
    jobs: dict[str, dict[str, float]] = {}
    for r in rows:
        if r["set"] != "golden":
            jobs.setdefault(r["job"], {})[r["layout"]] = math.log(r["ratio"])
    diffs, members = [], []
    for layouts in jobs.values():
        e = list(layouts.values())
        if len(e) < 2:
            continue
        pairs = [(a, b) for i, a in enumerate(e) for b in e[i + 1:]]
        diffs.append(sum((a - b) ** 2 for a, b in pairs) / len(pairs))
        members += e
    if not diffs:
        return {"rho": 0.0, "jobs": 0, "rows": 0}
    mean = sum(members) / len(members)
    var = sum((x - mean) ** 2 for x in members) / (len(members) - 1)
    rho = 1.0 - (sum(diffs) / len(diffs)) / (2.0 * var)
    return {"rho": round(min(max(rho, 0.0), 0.95), 4), "rho_unclipped": round(rho, 4),
            "jobs": len(diffs), "rows": len(members)}


def band_file(rows: list[dict], min_rows: int = bands.MIN_ROWS) -> dict:
    order = drop_order(rows, min_rows)
    corr = layout_correlation(rows)
    return {"schema_version": bands.SCHEMA_VERSION, "coverage": bands.COVERAGE,
            "quantiles": [bands.LOW_Q, bands.HIGH_Q], "min_rows": min_rows,
            "min_sources": bands.MIN_SOURCES,
            "features": list(bands.FEATURES), "drop_order": list(order),
            "rho": corr["rho"], "layout_pairs": corr,
            "sets": {k: sum(1 for r in rows if r["set"] == k)
                     for k in ("public", "golden")},
            "generated_by": "scripts/band_data.py",
            "groups": bands.build_groups(rows, order, min_rows),
            "rows": [{k: (round(v, 5) if isinstance(v, float) else v) for k, v in r.items()}
                     for r in rows]}


def table_without(rows: list[dict], source: str, min_rows: int = bands.MIN_ROWS
                  ) -> bands.BandTable:
    """The band table built from every row but those of ``source`` (drop order too)."""
    data = band_file([r for r in rows if r["source"] != source], min_rows)
    return bands.table_from_dict(data)


def held_out_coverage(rows: list[dict], min_rows: int = bands.MIN_ROWS) -> list[dict]:
    """Each public row against the band built without its source: inside or not, and
    the band's half-width over the projection."""
    out = []
    for source in sorted({r["source"] for r in rows if r["set"] == "public"}):
        table = table_without(rows, source, min_rows)
        for r in rows:
            if r["set"] != "public" or r["source"] != source:
                continue
            lo, hi, basis = bands.ratio_band(r, table)
            out.append({"run_id": r["run_id"], "source": source, "ratio": r["ratio"],
                        "low": lo, "high": hi, "inside": lo <= r["ratio"] <= hi,
                        "half_width": (hi - lo) / 2, "basis": basis})
    return out
