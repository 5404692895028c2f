"""Run ``launch/pretrain_gpt.py`` under torchrun in a subprocess (imported by file name)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

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


# Below this bf16 rate (TFLOP/s of a linear layer's three training GEMMs, one thread:
# measure/host_rate.py) the CPU has no native bf16: torch's fallbacks run some 30x below
# its fp32 rate (AVX2-only x86).
NATIVE_BF16_TFLOPS = 0.01


def skip_if_the_plan_finds_this_cpu_too_slow(res: subprocess.CompletedProcess) -> None:
    """Skip a full-width measurement the plan refused here, on a CPU without native
    bf16: a non-zero exit (3; torchrun reports its worker's 3 as 1) with the plan's
    line. Anything else is the test's to judge (a refusal on a machine with native bf16
    fails it)."""
    from primus_ext.measure.host_rate import matmul_tflops
    rate = matmul_tflops("bfloat16")
    if res.returncode != 0 and "the measurement does not fit cpu" in res.stderr \
            and rate < NATIVE_BF16_TFLOPS:
        line = next(ln for ln in res.stderr.splitlines()
                    if "the measurement does not fit cpu" in ln)
        pytest.skip(f"this CPU's bf16 matmul runs at {rate * 1e3:.2f} GFLOP/s (no native "
                    f"bf16); the plan refuses the measurement: {line}")
