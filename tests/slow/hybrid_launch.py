"""Run ``launch/pretrain_gpt.py`` under torchrun in a subprocess (imported by file name)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LAUNCH = ROOT / "launch" / "pretrain_gpt.py"
_TORCHRUN_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                  "MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT")

TINY = ["--num-layers", "4", "--hidden-size", "128", "--num-attention-heads", "4",
        "--ffn-hidden-size", "256", "--swiglu", "--normalization", "RMSNorm",
        "--position-embedding-type", "rope", "--disable-bias-linear",
        "--untie-embeddings-and-output-weights", "--seq-length", "128",
        "--max-position-embeddings", "128", "--micro-batch-size", "1", "--bf16",
        "--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "511",
        "--hidden-dropout", "0", "--attention-dropout", "0", "--attention-backend",
        "unfused"]


def torchrun(args: list[str], nproc: int = 2, timeout: int = 300,
             cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in _TORCHRUN_VARS}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), COLUMNS="200")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={nproc}", str(LAUNCH), *args]
    # A run past ``timeout`` is stopped whole: torchrun starts its workers in sessions of
    # their own, so killing torchrun alone leaves them computing for the rest of the suite.
    with subprocess.Popen(cmd, cwd=cwd or ROOT, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for pid in [*_descendants(proc.pid), proc.pid]:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            proc.communicate()
            raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (Linux /proc; none elsewhere)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for t in tasks:
            try:
                with open(f"/proc/{p}/task/{t}/children") as f:
                    kids = [int(c) for c in f.read().split()]
            except OSError:
                continue
            out += kids
            todo += kids
    return out
