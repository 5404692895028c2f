"""Measure, on this CPU, what Megatron-LM's weight-hash check costs the host per tensor
and per element: part of the reference host profile.

Megatron-LM ``check_param_hashes_across_dp_replicas`` (megatron/core/utils.py; called
every ``--check-weight-hash-across-dp-replicas-interval`` iterations from training.py
``post_training_step_callbacks``) hashes each parameter on the host:
``hashlib.sha1(param.data.to("cpu").float().numpy(force=True)).digest()``. This replays
that line on BF16 CPU tensors (one thread, as torchrun starts each rank) for a tiny
tensor (the per-tensor Python) and a large one (the conversion and SHA-1 per element)
and writes the minima to ``primus_ext/data/host/weight_hash.json``, read by
``project/weight_hash.py`` (over the target's ``host_speed``). Measure on the same host
as ``scripts/host_profile.py``; a few seconds.

Usage: python scripts/hash_host_profile.py [--out FILE] [--repeats N]
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("OMP_NUM_THREADS", "1")
OUT = ROOT / "primus_ext" / "data" / "host" / "weight_hash.json"
SMALL, LARGE = 16, 1 << 22  # elements


def _hash_s(t, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        a = time.perf_counter()
        hashlib.sha1(t.data.to("cpu").float().numpy(force=True)).digest()
        best = min(best, time.perf_counter() - a)
    return best


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--repeats", type=int, default=20)
    a = ap.parse_args(argv)
    import torch
    torch.set_num_threads(1)
    from primus_ext.measure.device import reference_host
    from primus_ext.util.files import atomic_write_text
    g = torch.Generator().manual_seed(0)
    small = _hash_s(torch.randn(SMALL, generator=g).to(torch.bfloat16), 50 * a.repeats)
    large = _hash_s(torch.randn(LARGE, generator=g).to(torch.bfloat16), a.repeats)
    out = {
        "schema_version": 1,
        "method": "scripts/hash_host_profile.py: hashlib.sha1(t.to('cpu').float()"
                  ".numpy(force=True)) on BF16 CPU tensors of "
                  f"{SMALL} and {LARGE} elements, 1 thread, minimum over repeats",
        "reference_host": reference_host(),
        "per_tensor_s": small,
        "per_element_s": max(large - small, 0.0) / LARGE,
    }
    atomic_write_text(a.out, json.dumps(out, indent=1, sort_keys=True) + "\n", "--out")
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
