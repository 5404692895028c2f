"""Error bands (project/bands.py, project/band_fit.py) against the held-out residuals
they are built from (data/bands/default.json, written by scripts/band_data.py)."""
from __future__ import annotations

import json
import math

import pytest

from primus_ext.project import bands
from primus_ext.project.band_fit import band_file, held_out_coverage, layout_correlation


@pytest.fixture(scope="module")
def committed():
    return json.loads(bands.DEFAULT_PATH.read_text())


def _row(ratio, source="s", **feats):
    base = {"arch": "dense", "hardware": "hopper", "scale": "9-64",
            "host": "device-bound", "recompute": "published"}
    return {**base, **feats, "ratio": ratio, "source": source, "set": "public",
            "run_id": f"r{ratio}", "job": "j", "layout": str(ratio)}


def test_predictive_quantile_widens_small_samples():
    xs = [0.9, 1.0, 1.1]
    # q * (n + 1) = 0.4 is below the first order statistic: the sample's minimum.
    assert bands.predictive_quantile(xs, 0.10) == 0.9
    assert bands.predictive_quantile(xs, 0.90) == 1.1
    many = [i / 100 for i in range(1, 100)]  # 99 values: position 10 and 90 exactly
    assert bands.predictive_quantile(many, 0.10) == pytest.approx(0.10)
    assert bands.predictive_quantile(many, 0.90) == pytest.approx(0.90)


def test_small_group_falls_back_to_a_wider_one():
    rows = ([_row(1.0 + i / 100, source=f"s{i % 2}") for i in range(10)]
            + [_row(0.5 + i / 100, hardware="amd", source=f"s{i % 2}") for i in range(3)]
            + [_row(0.7 + i / 100, hardware="ampere", source="one") for i in range(9)])
    order = ("hardware", "arch", "scale", "recompute", "host")
    groups = bands.build_groups(rows, order, min_rows=8, min_sources=2)
    table = bands.BandTable(groups=groups, drop_order=order, rho=0.0)
    key, g = table.lookup({**_row(1.0), "hardware": "hopper"})
    assert key.startswith("arch=dense,hardware=hopper") and g["rows"] == 10
    key, g = table.lookup({**_row(1.0), "hardware": "amd"})  # 3 rows: too few
    assert "hardware" not in key and g["rows"] == 22
    key, g = table.lookup({**_row(1.0), "hardware": "ampere"})  # 9 rows, one source
    assert "hardware" not in key and g["rows"] == 22
    assert table.lookup({**_row(1.0), "hardware": "amd", "arch": "moe",
                         "scale": "1-8", "host": "host-bound",
                         "recompute": "inferred"})[0] == "all"


def test_committed_table_is_what_its_rows_give(committed):
    """The committed groups are rebuilt from the committed residual rows."""
    again = band_file(committed["rows"], committed["min_rows"])
    assert again["drop_order"] == committed["drop_order"]
    for key, g in committed["groups"].items():
        assert again["groups"][key]["rows"] == g["rows"]
        assert again["groups"][key]["low"] == pytest.approx(g["low"], rel=1e-3)
    assert committed["sets"]["public"] >= 120


def test_held_out_coverage_of_the_public_set(committed):
    """Issue 25's done-when on the public set, each source's band built without it:
    70-95 % of measured values inside their 80 % band, median half-width <= 20 %."""
    cov = held_out_coverage(committed["rows"], committed["min_rows"])
    inside = sum(c["inside"] for c in cov) / len(cov)
    widths = sorted(c["half_width"] for c in cov)
    assert len(cov) == committed["sets"]["public"]
    assert 0.70 <= inside <= 0.95, inside
    assert widths[len(widths) // 2] <= 0.20


def test_layout_pairs_correlate(committed):
    """Two layouts of one job err alike: the fitted rho is that of the committed pairs,
    and positive (their differences vary less than their errors). The committed rows
    keep their residuals rounded, so the recomputed rho may differ in its last digit."""
    corr = layout_correlation(committed["rows"])
    assert corr["jobs"] >= 5 and abs(corr["rho"] - committed["rho"]) <= 2e-4
    assert 0.0 < committed["rho"] <= 0.95


def test_step_band_is_the_reciprocal_of_the_tokens_band():
    feats = _row(1.0)
    table = bands.load_bands()
    tb = bands.tokens_band(1000.0, feats, table)
    sb = bands.step_band(2.0, feats, table)
    lo, hi, _ = bands.ratio_band(feats, table)
    assert (tb.low, tb.high) == pytest.approx((1000 * lo, 1000 * hi))
    assert (sb.low, sb.high) == pytest.approx((2.0 / hi, 2.0 / lo))
    assert tb.coverage == 0.80 and "held-out rows" in tb.basis


def test_compare_ties_small_and_resolves_large_differences():
    feats = _row(1.0)
    table = bands.load_bands()
    lo, hi, _ = bands.ratio_band(feats, table)
    h = (math.log(hi) - math.log(lo)) / 2
    half = h * math.sqrt(2 * (1 - table.rho))  # same group: sqrt(2 (1 - rho)) h
    just_in, just_out = math.exp(0.9 * half), math.exp(1.1 * half)
    assert not bands.compare(just_in, feats, 1.0, feats, table).resolvable
    c = bands.compare(just_out, feats, 1.0, feats, table)
    assert c.resolvable and c.words().startswith("faster by")
    assert bands.compare(1.0, feats, just_out, feats, table).words().startswith("slower")
    # Uncorrelated errors tie more: the band of the difference is wider.
    assert not bands.compare(just_out, feats, 1.0, feats, table, rho=0.0).resolvable
    assert "tied" in bands.compare(1.0, feats, 1.0, feats, table).words()


def test_projection_carries_its_band():
    from primus_ext import compose, project
    spec = compose(["model=llama3.1_8b"])
    est = project(spec)
    out = est.to_dict()["error_band"]
    tb, sb = out["tokens_per_s_per_gpu"], out["step_time_s"]
    assert tb["low"] < tb["high"] and sb["low"] < sb["high"]
    assert tb["low"] * sb["high"] == pytest.approx(est.tokens_per_s_per_gpu
                                                   * est.step_time_s)
    assert est.band_features == {"arch": "dense", "hardware": "hopper", "scale": "1-8"}


def test_validate_csv_has_the_band_columns(tmp_path):
    """mode=validate's CSV: tokens_per_s_per_gpu_low / _high around each projection,
    from the row's group (a row whose source left recompute empty: 'inferred')."""
    import csv

    from primus_ext.modes.validate import validate, write_csv
    from primus_ext.published import DEFAULT_PATH
    with open(DEFAULT_PATH, newline="") as f:
        rows = list(csv.DictReader(f))[:3]
    src = tmp_path / "runs.csv"
    with open(src, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    results = validate(src)
    write_csv(results, tmp_path / "out.csv")
    with open(tmp_path / "out.csv", newline="") as f:
        out = list(csv.DictReader(f))
    assert len(out) == 3
    for r, res in zip(out, results):
        lo, hi = float(r["tokens_per_s_per_gpu_low"]), float(r["tokens_per_s_per_gpu_high"])
        assert lo < hi
        feats = bands.estimate_features(res.estimate, res.recompute_inferred)
        assert lo / float(r["tokens_per_s_per_gpu"]) == pytest.approx(
            bands.ratio_band(feats)[0], rel=1e-3)
    assert all(res.recompute_inferred == (not row["recompute"].strip())
               for res, row in zip(results, rows))
