"""The tuner's default search against the exhaustive optimum, on the two reference jobs.

For Llama 3.1 70B on 64 H100 and Mixtral 8x22B on 64 MI355X (GBS 128, seq 8192, BF16),
runs ``tune.strategy`` auto (the default) and exhaustive with the same projector, and
prints best tokens/s/GPU, candidates evaluated, projected, seconds, the winners, and
the default's gap to the optimum. Nothing is written to disk.

Usage: python scripts/bench_tune.py [--case llama|mixtral|all] [--skip-exhaustive]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from primus_ext.tune.run import tune  # noqa: E402
from primus_ext.tune.space import describe  # noqa: E402

CASES = {
    "llama": ["model=llama3.1_70b", "cluster.hardware=h100", "cluster.num_nodes=8",
              "train.global_batch_size=128", "train.seq_length=8192",
              "train.precision=bf16"],
    "mixtral": ["model=mixtral_8x22b", "cluster.hardware=mi355x", "cluster.num_nodes=8",
                "train.global_batch_size=128", "train.seq_length=8192",
                "train.precision=bf16"],
}
EXHAUSTIVE = ["tune.strategy=exhaustive"]


def _run(overrides: list[str]) -> tuple:
    t0 = time.perf_counter()
    r = tune(overrides + ["tune.progress=false", "tune.reference=null"], write=False)
    wall = time.perf_counter() - t0
    return r, wall


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", choices=("llama", "mixtral", "all"), default="all")
    ap.add_argument("--skip-exhaustive", action="store_true")
    args = ap.parse_args()
    cases = list(CASES) if args.case == "all" else [args.case]
    rows = []
    for name in cases:
        default, t_default = _run(CASES[name])
        line = {"case": name, "legal": default.space["num_legal"],
                "default": (default.strategy, default.best.metrics["tokens_per_s_per_gpu"],
                            default.stats["evaluated"], default.stats["projected"],
                            t_default, describe(default.best.point))}
        if not args.skip_exhaustive:
            ex, t_ex = _run(CASES[name] + EXHAUSTIVE)
            line["exhaustive"] = ("exhaustive", ex.best.metrics["tokens_per_s_per_gpu"],
                                  ex.stats["evaluated"], ex.stats["projected"], t_ex,
                                  describe(ex.best.point))
        rows.append(line)

    print(f"{'case':8} {'search':11} {'best tok/s/GPU':>15} {'candidates':>10} "
          f"{'projected':>9} {'seconds':>8}  winner")
    for line in rows:
        for key in ("default", "exhaustive"):
            if key not in line:
                continue
            strat, tps, n, proj, secs, win = line[key]
            label = f"{key[:3]}:{strat}" if key == "default" else "exhaustive"
            print(f"{line['case']:8} {label:11} {tps:15,.1f} {n:10,} {proj:9,} "
                  f"{secs:8.1f}  {win}")
        if "exhaustive" in line:
            gap = 1 - line["default"][1] / line["exhaustive"][1]
            print(f"{line['case']:8} gap to the exhaustive optimum: {gap:.3%} "
                  f"({line['legal']:,} legal candidates; default used "
                  f"{line['default'][2] / line['legal']:.1%} of them)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
