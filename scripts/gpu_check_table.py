#!/usr/bin/env python
"""The table of scripts/gpu_check.sh: per case, the hybrid projection against the real
run on the same device -- step time and memory -- and what the projection measured and
modelled.

    python scripts/gpu_check_table.py OUT_DIR CASE [CASE ...]

Reads OUT_DIR/<case>.projection.json (the drop-in's --projection-out) and
OUT_DIR/<case>.timings.json (the drop-in's training --timings-out). Memory: on CUDA the
projected allocated peak against torch's max_memory_allocated; on a CPU against the
resident-set growth of the real run (a proxy: a CPU keeps no allocator statistics, and
the growth also holds the allocator's cached pages). Exits 1 if a file is missing.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

GIB = 1 << 30


def _err(p: float, m: float) -> str:
    return f"{(p - m) / m:+.1%}" if m else "n/a"


def rows(out: Path, case: str) -> dict:
    proj = json.loads((out / f"{case}.projection.json").read_text())
    real = json.loads((out / f"{case}.timings.json").read_text())
    alloc = max(s["allocated_peak_bytes"] for s in proj["memory"]["stages"])
    if real.get("max_memory_allocated_bytes") is not None:
        mem_kind, mem_real = "allocated peak", real["max_memory_allocated_bytes"]
    else:
        mem_kind, mem_real = "RSS growth (CPU proxy)", real.get("rss_growth_bytes", 0)
    return {"case": case, "proj_step_s": proj["step_time_s"],
            "real_step_s": real["median_step_s"], "proj_mem_gib": alloc / GIB,
            "real_mem_gib": mem_real / GIB, "mem_kind": mem_kind,
            "measurement": proj.get("measurement", {})}


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__.strip().splitlines()[3].strip(), file=sys.stderr)
        return 2
    out = Path(argv[0])
    try:
        table = [rows(out, c) for c in argv[1:]]
    except (OSError, KeyError, ValueError) as exc:
        print(f"gpu_check_table: {exc}", file=sys.stderr)
        return 1
    print(f"\n{'case':<7} {'step proj (s)':>13} {'step real (s)':>13} {'error':>7}  "
          f"{'mem proj (GiB)':>14} {'mem real (GiB)':>14} {'error':>7}  memory measured as")
    for r in table:
        print(f"{r['case']:<7} {r['proj_step_s']:>13.4f} {r['real_step_s']:>13.4f} "
              f"{_err(r['proj_step_s'], r['real_step_s']):>7}  {r['proj_mem_gib']:>14.3f} "
              f"{r['real_mem_gib']:>14.3f} {_err(r['proj_mem_gib'], r['real_mem_gib']):>7}  "
              f"{r['mem_kind']}")
    for r in table:
        m = r["measurement"]
        print(f"\n{r['case']}: measured on {m.get('device')}; {m.get('plan')}")
        print("  measured: " + ", ".join(m.get("measured", [])))
        print("  modelled: " + ", ".join(m.get("modelled", [])))
        for rule in m.get("downscale_rules", []):
            print("  rule: " + rule)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
