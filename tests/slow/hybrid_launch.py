"""Run ``launch/pretrain_gpt.py`` under torchrun in a subprocess (imported by file name)."""
from __future__ import annotations

import os
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
    return subprocess.run(cmd, cwd=cwd or ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)
