"""Measure the host time of megatron-core's combined-1F1B schedule nodes on this CPU.

Runs ``primus_ext/measure/schedule_node.py`` (its docstring says how) and writes
``primus_ext/data/host/schedule_node.json``, which the host clock reads for
``--overlap-moe-expert-parallel-comm`` (``compute/host.py``). Takes a few seconds; run it
on the reference host, idle (``taskset`` one core if others are busy).

Usage: python scripts/schedule_node_profile.py [--out FILE]
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
OUT = ROOT / "primus_ext" / "data" / "host" / "schedule_node.json"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(OUT))
    a = ap.parse_args(argv)
    import torch
    torch.set_num_threads(1)
    from primus_ext.measure.device import reference_host
    from primus_ext.util.files import atomic_write_text
    from primus_ext.measure.schedule_node import NODES, REPEATS, measure
    res = measure()
    print(f"node: fwd {res['node_fwd_s'] * 1e6:.1f} us, bwd {res['node_bwd_s'] * 1e6:.1f} us "
          f"(plain op fwd {res['plain_op_fwd_s'] * 1e6:.1f} us, bwd "
          f"{res['plain_op_bwd_s'] * 1e6:.1f} us)", file=sys.stderr)
    data = {"schema_version": 1,
            "reference_host": reference_host(with_megatron=True),
            "method": "scripts/schedule_node_profile.py: megatron-core TransformerLayerNode "
                      f"chain of {NODES} nodes over one elementwise op each against the "
                      f"plain chain, minimum over {REPEATS} repeats; CUDA stream, event, "
                      "NVTX and record_stream calls stubbed",
            **{k: round(v, 9) for k, v in res.items()}}
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, json.dumps(data, indent=1, sort_keys=True) + "\n", "--out")
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
