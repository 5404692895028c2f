"""Measure Muon's per-weight host time on this CPU: part of the reference host profile.

Replays one Muon step on one weight (``primus_ext/measure/muon_replica.py``, written from
Emerging-Optimizers v0.1.0 and megatron-core 0.16.1 optimizer/muon.py) with tiny
tensors, once for a plain weight and once for a fused QKV weight split into its q, k and
v blocks (two query groups: strided slices), and writes the minimum seconds of each with
its kernel count to ``primus_ext/data/host/muon.json``, which ``project/muon_step.py``
reads (Python and dispatch per weight, over the target's ``host_speed``). Measure on the
same host as ``scripts/host_profile.py``; a few seconds.

Usage: python scripts/muon_host_profile.py [--out FILE] [--repeats N]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("OMP_NUM_THREADS", "1")
OUT = ROOT / "primus_ext" / "data" / "host" / "muon.json"
# Tiny shapes: the ops' own work is negligible next to their Python and dispatch.
PLAIN = (2, 4)
QKV = ((12, 4), (2, 2, 2))  # 2 query groups of q, k and v 2 rows each


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--repeats", type=int, default=400)
    a = ap.parse_args(argv)
    import torch
    torch.set_num_threads(1)
    from primus_ext.measure.device import reference_host
    from primus_ext.util.files import atomic_write_text
    from primus_ext.measure.muon_replica import count_kernels, seconds_per_weight
    (r, c), ((qr, qc), split) = PLAIN, QKV
    out = {
        "schema_version": 1,
        "method": "scripts/muon_host_profile.py: primus_ext/measure/muon_replica.py, "
                  f"fp32 CPU tensors, 1 thread, minimum over {a.repeats} steps after 10",
        "reference_host": reference_host(),
        "plain": {"shape": list(PLAIN), "kernels": count_kernels(r, c),
                  "seconds": seconds_per_weight(r, c, a.repeats)},
        "split_qkv": {"shape": [qr, qc], "split": list(split),
                      "kernels": count_kernels(qr, qc, split_shapes=split),
                      "seconds": seconds_per_weight(qr, qc, a.repeats, split_shapes=split)},
    }
    atomic_write_text(a.out, json.dumps(out, indent=1, sort_keys=True) + "\n", "--out")
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
