"""What the CPU proofs share (scripts/cpu_proof.py for megatron-core,
scripts/cpu_proof_torchtitan.py for torchtitan; their goal is GOAL, below): the
child-process environment and runner, the torchrun prefix, the machine's load, the
median, the collective microbenchmark fits put into a profile, the steady-state steps of
a real run and the version line of the results.
"""
from __future__ import annotations

import dataclasses
import datetime
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def env() -> dict:
    """A child's environment: no process-group settings of ours, one thread, the repo on
    the path."""
    drop = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
            "MASTER_PORT", "TORCHELASTIC_RUN_ID")
    out = {k: v for k, v in os.environ.items() if k not in drop}
    out.update(OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), COLUMNS="200")
    return out


def run(cmd: list[str], timeout: int) -> subprocess.CompletedProcess:
    res = subprocess.run(cmd, cwd=ROOT, env=env(), capture_output=True, text=True,
                         timeout=timeout)
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:6])} ... failed:\n{res.stderr[-4000:]}")
    return res


def torchrun(nproc: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc-per-node={nproc}"]


def load() -> float:
    """The 1-minute load average (other work on the machine shows up here)."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return float("nan")


def med(xs: list[float]) -> float:
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])


def steady_steps(steps: list[float], warmup: int) -> list[float]:
    """The steps after the first ``warmup`` (allocator, oneDNN kernel caches and
    gloo's connections settle in them), or all of them if that leaves fewer than 3."""
    return steps[warmup:] if len(steps) - warmup >= 3 else list(steps)


def with_fits(profile_path: str, fits: list[dict]):
    """The Profile at ``profile_path`` with the microbenchmark ``fits`` (the JSON that
    ``fit_collectives`` writes) as its ``comm_fits``."""
    from primus_ext.project.profile import CommFit, Profile
    prof = Profile.load(profile_path)
    return dataclasses.replace(prof, comm_fits=tuple(
        CommFit(**{**f, "points": tuple(tuple(p) for p in f["points"])}) for f in fits))


def fit_collectives(out: str, max_log2: int, repeats: int) -> None:
    """In every process of an initialised group: benchmark the collectives
    (``primus_ext.measure.microbench``, sizes 1 KiB to 2**max_log2 bytes) and write the
    alpha-beta fits to ``out`` from rank 0."""
    import torch.distributed as dist

    from primus_ext.measure.microbench import run_microbenchmarks
    sizes = tuple(2 ** k for k in range(10, max_log2, 2))
    fits = run_microbenchmarks({}, sizes=sizes, repeats=repeats)
    if dist.get_rank() == 0:
        Path(out).write_text(json.dumps([dataclasses.asdict(f) for f in fits]))
    dist.destroy_process_group()


def meta(quick: bool, iters: int, repeats: int, rounds: int, **extra) -> dict:
    import platform

    import torch
    return {"date": datetime.date.today().isoformat(), "quick": quick, "iters": iters,
            "repeats": repeats, "rounds": rounds, "cores": os.cpu_count(),
            "machine": platform.processor() or platform.machine() or "cpu",
            "torch": torch.__version__, **extra}


# Every proof's goal: each config's median error within this.
GOAL = 0.15


def paired_error(rounds: list[dict]) -> float:
    """The median over rounds of each round's error, projected / measured - 1. A round
    measures a target and runs it for real a minute later, so the pair sees one state of
    the machine, whose speed drifts over minutes; the median of the projections and the
    median of the real steps can come from different rounds (different machines)."""
    return med([x["projected"] / x["measured"] - 1.0 for x in rounds])


def result_table(rows: list[dict]) -> list[str]:
    """The goal line and the projected-against-measured table of a proof page: medians
    over rounds of the projected and the measured step, and the median of the rounds'
    errors (``paired_error``)."""
    lines = [f"Goal: every error within {GOAL:.0%}.", "",
             "| config | what | projected step (s) | measured step (s) | error |",
             "| --- | --- | ---: | ---: | ---: |"]
    for r in rows:
        err = paired_error(r["rounds"]) if r.get("rounds") else r["error"]
        lines.append(f"| {r['config']} | {r['what']} | {r['projected_step_s']:.4f} | "
                     f"{r['measured_step_s']:.4f} | {err:+.1%} |")
    return lines


def breakdown_table(rows: list[dict]) -> list[str]:
    """The projected step's breakdown (s) of every config, one row each."""
    keys = rows[0]["breakdown"]
    lines = ["| config | " + " | ".join(k[:-2] for k in keys) + " |",
             "| --- | " + " | ".join("---:" for _ in keys) + " |"]
    for r in rows:
        lines.append(f"| {r['config']} | "
                     + " | ".join(f"{v:.4f}" for v in r["breakdown"].values()) + " |")
    return lines
