"""Measure megatron-core's host issue time on this CPU: the reference host profile.

Runs ``primus_ext/measure/host_profile.py`` (its docstring says how) for every variant
and writes ``primus_ext/data/host/reference.json``, the committed profile the simulate
backend's host clock reads (``compute/host.py``). Takes about a minute; run it on an
idle machine (``taskset`` one core if others are busy).

Usage: python scripts/host_profile.py [--out FILE] [--steps N] [--variants a,b]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("OMP_NUM_THREADS", "1")
OUT = ROOT / "primus_ext" / "data" / "host" / "reference.json"


def main(argv=None) -> int:
    # torch-free at import (megatron.core comes in after prepare_runtime below)
    from primus_ext.measure.host_profile import (DEPTHS, MICROBATCHES, VARIANTS,
                                                 gpu_like_optimizer, measure_variant)
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    a = ap.parse_args(argv)
    from primus_ext.frameworks.megatron.build import init_distributed, prepare_runtime
    prepare_runtime(1)
    init_distributed()
    gpu_like_optimizer()
    from primus_ext.measure.device import reference_host
    from primus_ext.util.files import atomic_write_text
    t0 = time.perf_counter()
    variants = {}
    for name in a.variants.split(","):
        variants[name] = measure_variant(name, a.steps)
        print(f"{name}: layer fwd+bwd {variants[name]['layer_s'] * 1e3:.3f} ms "
              f"({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    data = {"schema_version": 1,
            "reference_host": reference_host(with_megatron=True),
            "method": "scripts/host_profile.py: local spec, bf16, 1 process, hidden 32, "
                      f"sequence 8, {MICROBATCHES} microbatches, depths {DEPTHS}, "
                      f"minimum over {a.steps - 3} steps after 3 (hooked splits: "
                      "median)",
            "variants": variants}
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, json.dumps(data, indent=1, sort_keys=True) + "\n", "--out")
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
