"""Capture Megatron-LM's own verdicts on launch lines as test data.

usage: python scripts/megatron_lm_verdicts.py --tool DIR --out tests/data/megatron_lm_verdicts
       CASE.json [CASE.json ...]

DIR holds Megatron-LM's ``megatron/training`` at tag core_v0.16.1 with its
``check_recipe.py`` (parse_args + validate_args on a torchrun line, an H100 assumed where
they ask the GPU). A CASE file is ``{"name", "source", "nnodes", "nproc", "env",
"flags"}`` (``flags``: the tokens after pretrain_gpt.py), or ``{"name", "source",
"script"}`` naming a ``megatron_args.sh`` to read them from. Each case is written to
``OUT/<name>.json`` with ``verdict`` ("accepted" / "refused"), Megatron-LM's ``message``
when refused and the ``derived`` layout when accepted. Tests read only OUT.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

LAYOUT_KEYS = ("tensor_model_parallel_size", "pipeline_model_parallel_size",
               "virtual_pipeline_model_parallel_size", "context_parallel_size",
               "expert_model_parallel_size", "expert_tensor_parallel_size",
               "data_parallel_size", "micro_batch_size", "global_batch_size",
               "num_microbatches", "seq_length", "use_distributed_optimizer",
               "use_torch_fsdp2", "use_megatron_fsdp", "overlap_param_gather",
               "kv_lora_rank", "padded_vocab_size")


def read_script(path: str) -> dict:
    text = Path(path).read_text().replace("\\\n", " ")
    toks = shlex.split(re.search(r"torchrun(.*)", text, re.S).group(1))
    i = next(k for k, t in enumerate(toks) if t.endswith("pretrain_gpt.py"))
    env = dict(re.findall(r"^export (CUDA_DEVICE_MAX_CONNECTIONS)=(\S+)", text, re.M))
    return {"nnodes": int(re.search(r"NNODES:-(\d+)", text).group(1)),
            "nproc": int(toks[toks.index("--nproc-per-node") + 1]),
            "env": env, "flags": toks[i + 1:]}


def script_text(case: dict) -> str:
    lines = ["#!/usr/bin/env bash", f"export NNODES=${{NNODES:-{case['nnodes']}}}"]
    lines += [f"export {k}={v}" for k, v in case.get("env", {}).items()]
    lines.append(f"torchrun --nnodes $NNODES --nproc-per-node {case['nproc']} "
                 f"\"$MEGATRON_LM/pretrain_gpt.py\" "
                 + " ".join(shlex.quote(str(f)) for f in case["flags"]))
    return "\n".join(lines) + "\n"


def verdict(tool: str, case: dict) -> dict:
    with tempfile.NamedTemporaryFile("w", suffix=".sh", delete=False) as f:
        f.write(script_text(case))
    try:
        out = subprocess.run([sys.executable, os.path.join(tool, "check_recipe.py"), f.name],
                             capture_output=True, text=True, timeout=600)
    finally:
        os.unlink(f.name)
    text = out.stdout + out.stderr
    if "VALIDATE_ARGS OK" in out.stdout:
        derived = json.loads(out.stdout.split("VALIDATE_ARGS OK", 1)[1])
        return {"verdict": "accepted",
                "derived": {k: derived.get(k) for k in LAYOUT_KEYS}}
    errors = re.findall(r"^(\w*Error): (.*)$", text, re.M)
    return {"verdict": "refused", "message": errors[-1][1] if errors else text[-400:]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tool", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("cases", nargs="+")
    a = ap.parse_args()
    Path(a.out).mkdir(parents=True, exist_ok=True)
    for path in a.cases:
        case = json.loads(Path(path).read_text())
        if "script" in case:
            case.update(read_script(case.pop("script")))
        case.update(verdict(a.tool, case))
        dest = Path(a.out) / f"{case['name']}.json"
        tmp = dest.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(case, indent=1) + "\n")
        os.replace(tmp, dest)
        print(case["name"], case["verdict"], case.get("message", ""))


if __name__ == "__main__":
    main()
