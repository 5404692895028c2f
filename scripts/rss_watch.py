#!/usr/bin/env python
"""Run a command, measure its process tree's wall time and peak total RSS, and kill the
whole tree if that RSS passes a limit (a shared machine must not lose its memory).

    python scripts/rss_watch.py --limit-gib 8 [--json OUT] -- CMD ARGS...

Polls /proc every --interval seconds (default 0.2): the resident sets of the command and
every descendant, summed. Prints one line on stderr at the end: wall seconds, peak RSS,
exit status, and whether the limit killed it (exit 137 then). Linux only.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time

PAGE = os.sysconf("SC_PAGE_SIZE")


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        kids.setdefault(ppid, []).append(int(name))
    return kids


def tree_rss_bytes(root: int) -> int:
    kids = _children()
    todo, total = [root], 0
    while todo:
        pid = todo.pop()
        todo += kids.get(pid, [])
        try:
            with open(f"/proc/{pid}/statm") as f:
                total += int(f.read().split()[1]) * PAGE
        except OSError:
            pass
    return total


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--limit-gib", type=float, default=8.0)
    ap.add_argument("--interval", type=float, default=0.2)
    ap.add_argument("--json", help="write {wall_s, peak_rss_gib, rc, killed} here")
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    cmd = a.cmd[1:] if a.cmd[:1] == ["--"] else a.cmd
    if not cmd:
        ap.error("no command given (after --)")
    limit = int(a.limit_gib * (1 << 30))
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, start_new_session=True)
    peak, killed = 0, False
    while proc.poll() is None:
        rss = tree_rss_bytes(proc.pid)
        peak = max(peak, rss)
        if rss > limit:
            killed = True
            os.killpg(proc.pid, signal.SIGKILL)
            break
        time.sleep(a.interval)
    rc = proc.wait()
    wall = time.perf_counter() - t0
    out = {"wall_s": round(wall, 1), "peak_rss_gib": round(peak / (1 << 30), 3), "rc": rc,
           "killed": killed, "limit_gib": a.limit_gib}
    print(f"rss_watch: wall {wall:.1f} s ({wall / 60:.2f} min), peak RSS "
          f"{peak / (1 << 30):.2f} GiB (limit {a.limit_gib:g}), rc {rc}"
          + (" -- KILLED at the limit" if killed else ""), file=sys.stderr, flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f)
    return 137 if killed else rc


if __name__ == "__main__":
    sys.exit(main())
