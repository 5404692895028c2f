"""The error bands' data (primus_ext/data/bands/default.json), from held-out residuals.

Residual = measured / projected tokens/s/GPU of a run the projector's constants were not
fitted on:
- the public validation set (data/validation/published_runs.csv), leave-one-source-out
  (mode=calibrate's ``held_out_results``: each source projected by constants fitted on
  the other sources);
- Megatron-LM's golden values (tests/data/megatron_golden via published/golden.py),
  leave-one-family-out (``held_out_host_results``); they inform the host-bound groups
  only (their device-bound cases are a dozen tiny functional tests, not runs a user
  books a cluster on);

Groups and their fallback are those of primus_ext/project/bands.py; the order in which
features are dropped is chosen here from the data (the feature whose split narrows the
bands least goes first). ``rho``, the correlation of the log errors of two layouts of
one job, comes from the pairs of layouts of one job (same model, GPU, GPU count, global
batch, sequence, precision) among the public rows.

Usage: python scripts/band_data.py [--write] [--cache FILE]  (``--cache``: reuse or save
the residual rows, which take minutes to compute; ``--write`` writes the band file)
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from primus_ext.project import bands  # noqa: E402
from primus_ext.project.band_fit import band_file, held_out_coverage  # noqa: E402
from primus_ext.util.files import atomic_write_text  # noqa: E402

OUT = bands.DEFAULT_PATH


def residual_rows(held, runs, kind: str) -> list[dict]:
    """One dict per projected row with a measured figure: ids, features, ratio."""
    by_id = {r.run_id: r for r in runs}
    out = []
    for res in held:
        if res.rel_error is None:
            continue
        run = by_id[res.run_id]
        feats = bands.features_of(run.spec, res.estimate, res.recompute_inferred)
        p, s = run.spec.parallel, run.spec
        out.append({"run_id": res.run_id, "set": kind, "source": res.source,
                    "job": "|".join(map(str, (s.model.name, s.cluster.hardware.name,
                                              s.world_size, s.train.global_batch_size,
                                              s.train.seq_length, s.train.precision))),
                    "layout": "|".join(map(str, (p.tp, p.pp, p.vpp, p.cp, p.ep, p.etp,
                                                 s.train.micro_batch_size,
                                                 s.train.recompute_granularity,
                                                 s.framework))),
                    "ratio": 1.0 / (1.0 + res.rel_error), **feats})
    return out


def compute_rows() -> list[dict]:
    from primus_ext.modes.calibrate import held_out_host_results, held_out_results
    from primus_ext.project.calibration import load_calibration
    from primus_ext.published import DEFAULT_PATH, read_runs
    from primus_ext.published.golden import as_runs, read_golden
    calib = load_calibration("default")
    runs = read_runs(DEFAULT_PATH)
    golden = as_runs(read_golden(timed_only=True))
    public = held_out_results(runs, warm=calib, host_runs=golden)
    rows = residual_rows(public, runs, "public")
    gold = held_out_host_results(runs, golden, warm=calib)
    rows += [r for r in residual_rows(gold, golden, "golden") if r["host"] == "host-bound"]
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--write", action="store_true", help=f"write {OUT.relative_to(ROOT)}")
    ap.add_argument("--cache", help="residual rows JSON: read if it exists, else write")
    ap.add_argument("--min-rows", type=int, default=bands.MIN_ROWS)
    args = ap.parse_args()
    cache = Path(args.cache) if args.cache else None
    if cache is not None and cache.is_file():
        rows = json.loads(cache.read_text())
    else:
        rows = compute_rows()
        if cache is not None:
            atomic_write_text(cache, json.dumps(rows), "--cache")
    data = band_file(rows, args.min_rows)
    cov = held_out_coverage(rows, args.min_rows)
    inside = sum(c["inside"] for c in cov) / len(cov)
    widths = sorted(c["half_width"] for c in cov)
    print(f"rows: {data['sets']}; drop order {data['drop_order']}; rho {data['rho']} "
          f"({data['layout_pairs']})")
    print(f"public rows held out (band built without their source): {len(cov)}, inside "
          f"{inside:.1%}, median half-width {widths[len(widths) // 2]:.1%}")
    for key, g in sorted(data["groups"].items()):
        print(f"  {key}: {g['rows']} rows, {g['low']:.3f}-{g['high']:.3f}")
    if args.write:
        OUT.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(OUT, json.dumps(data, indent=1, sort_keys=True) + "\n", "bands")
        print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
