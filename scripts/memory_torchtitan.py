#!/usr/bin/env python
"""The memory model against what real torchtitan models allocate and save on this CPU.

For each case (FSDP2 over 2 processes, TP 2, PP 2 with 1F1B; a tiny llama3), torchtitan's
own Trainer runs under torchrun with the CPU patches and every rank counts its parameters,
gradients, optimizer state and the activations one microbatch's forward saves
(``primus_ext.frameworks.torchtitan.measure_memory``). The memory model is any function
``spec -> MemoryReport`` (``--model-fn module:function``; the default is
``primus_ext:memory``), asked about the same layout as a primus-ext spec; rank r is
compared with stage ``r // (ranks per stage)``.

    .venv/bin/python scripts/memory_torchtitan.py [--write] [--model-fn mod:fn]
        [--cases fsdp2,tp2,pp2] [--json FILE]

``--write`` writes docs/memory-torchtitan.md. The figures are bytes per rank;
activations are per microbatch of the stage (``activation_bytes_per_microbatch``).
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import importlib
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from cpu_proof import _run, _torchrun  # noqa: E402

REGISTRY = ["--module", "llama3", "--config", "llama3_debugmodel"]
# seq * micro batch differs from every weight dim, so no saved activation has a weight's
# shape (the counts do not depend on it, but a reader of the details can tell them apart).
DIMS = {"num_layers": 4, "hidden_size": 128, "num_attention_heads": 4,
        "num_query_groups": 2, "ffn_hidden_size": 256, "vocab_size": 512}
SEQ = 96


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    overrides: tuple[str, ...]
    flags: tuple[str, ...]
    what: str


def cases() -> list[Case]:
    d = DIMS
    base = ["model=tiny_dense", f"model.num_layers={d['num_layers']}",
            f"model.hidden_size={d['hidden_size']}",
            f"model.num_attention_heads={d['num_attention_heads']}",
            f"model.num_query_groups={d['num_query_groups']}",
            f"model.ffn_hidden_size={d['ffn_hidden_size']}",
            f"model.vocab_size={d['vocab_size']}", f"train.seq_length={SEQ}",
            "cluster.hardware=cpu", "cluster.num_nodes=1", "cluster.gpus_per_node=2"]
    tt = ["--training.seq_len", str(SEQ)]
    return [
        Case("fsdp2", tuple(base + ["parallel.fsdp=true", "train.micro_batch_size=2",
                                    "train.global_batch_size=4"]),
             tuple(tt + ["--parallelism.data_parallel_shard_degree", "2",
                         "--training.local_batch_size", "2"]),
             "FSDP2 over 2 processes, micro batch 2"),
        Case("tp2", tuple(base + ["parallel.tp=2", "parallel.sequence_parallel=true",
                                  "train.micro_batch_size=2", "train.global_batch_size=2"]),
             tuple(tt + ["--parallelism.data_parallel_shard_degree", "1",
                         "--parallelism.tensor_parallel_degree", "2",
                         "--training.local_batch_size", "2"]),
             "TP 2 with SP, micro batch 2"),
        Case("pp2", tuple(base + ["parallel.pp=2", "parallel.schedule=1f1b",
                                  "train.micro_batch_size=1", "train.global_batch_size=2"]),
             tuple(tt + ["--parallelism.data_parallel_shard_degree", "1",
                         "--parallelism.pipeline_parallel_degree", "2",
                         "--parallelism.pipeline_parallel_schedule", "1F1B",
                         "--parallelism.pipeline_parallel_microbatch_size", "1",
                         "--training.local_batch_size", "2"]),
             "PP 2 (1F1B), micro batch 1, 2 microbatches"),
    ]


def measure(case: Case, tmp: Path) -> list[dict]:
    out = tmp / f"mem_{case.name}.json"
    _run(_torchrun(2) + ["-m", "primus_ext.frameworks.torchtitan.measure_memory",
                         "--out", str(out), "--model-dims", json.dumps(DIMS),
                         "--assets", str(tmp / "assets"), *REGISTRY, *case.flags,
                         "--training.steps", "1", "--metrics.log_freq", str(10 ** 6),
                         "--dump_folder", str(tmp / "dump"), "activation-checkpoint:none"],
         timeout=900)
    return json.loads(out.read_text())["ranks"]


def load_model_fn(name: str):
    mod, _, fn = name.partition(":")
    if not fn:
        raise SystemExit(f"--model-fn={name!r} must be module:function")
    return getattr(importlib.import_module(mod), fn)


def compare(case: Case, ranks: list[dict], model_fn) -> list[dict]:
    import primus_ext
    spec = primus_ext.compose(list(case.overrides))
    report = model_fn(spec)
    per_stage = max(len(ranks) // spec.parallel.pp, 1)
    rows = []
    for r, got in enumerate(ranks):
        st = report.stages[min(r // per_stage, len(report.stages) - 1)]
        for what, model_v, real_v in (
                ("parameters", st.param_bytes, got["param_bytes"]),
                ("gradients", st.grad_bytes, got["grad_bytes"]),
                ("optimizer state", st.optimizer_bytes, got["optimizer_bytes"]),
                ("activations / microbatch", st.activation_bytes_per_microbatch,
                 got["activation_bytes"])):
            rows.append({"case": case.name, "rank": r, "stage": st.stage, "what": what,
                         "model_bytes": int(model_v), "real_bytes": int(real_v),
                         "diff_bytes": int(model_v) - int(real_v)})
    return rows


NAMED = """## Named differences (torchtitan on this CPU)

- **Unsharded parameters kept through backward.** torchtitan keeps FSDP2's bf16
  all-gathered parameters of a group alive from forward to backward where it sets
  `reshard_after_forward=False` (under PP every group; without PP the last); autograd
  saves them (a linear saves its weight). They are counted apart ("unsharded params
  saved" below), not in the activations: they are the all-gathered blocks in flight.
- **The output layer and the loss.** torchtitan's `ChunkedLossWrapper` runs the lm_head
  inside the loss, chunk by chunk, outside the model's forward: the activation count
  (one forward of the model part) holds the final norm but no logits.
- **`step` of AdamW.** One fp32 scalar tensor per parameter tensor
  (`optimizer_step_bytes`), not in the optimizer state above.
- **Attention.** On this CPU FlexAttention is replaced by SDPA (patches/torchtitan_sdpa.py);
  the CPU's fused SDPA kernel saves the output and the log-sum-exp as flash attention
  does on a GPU.
- **RMSNorm on the CPU (CPU only).** torch 2.13's CPU `rms_norm` is composite: each norm
  saves its input cast to fp32 (`ToCopyBackward0`), the fp32 product (`MulBackward0`) and
  the fp32 `rsqrt` statistics; a fused GPU kernel saves its input and the statistics.
- **Blocks in flight (CPU only).** CPU compute is synchronous, so FSDP2's implicit
  forward prefetch (the next block's all-gather issued while the GPU still computes this
  one) does not happen: one block's parameters are gathered at a time here.
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--write", action="store_true", help="write docs/memory-torchtitan.md")
    ap.add_argument("--model-fn", default="primus_ext:memory",
                    help="the memory model, module:function taking a RunSpec")
    ap.add_argument("--cases", default=None, help="comma-separated subset")
    ap.add_argument("--json", default=None, help="write the rows as JSON")
    a = ap.parse_args()
    model_fn = load_model_fn(a.model_fn)
    known = {c.name: c for c in cases()}
    names = a.cases.split(",") if a.cases else list(known)
    bad = sorted(set(names) - set(known))
    if bad:
        raise SystemExit(f"--cases: unknown {bad}; known: {sorted(known)}")
    rows, raw = [], {}
    with tempfile.TemporaryDirectory() as tmpd:
        for name in names:
            print(f"real torchtitan run {name}, 2 processes ...", flush=True)
            ranks = measure(known[name], Path(tmpd))
            raw[name] = ranks
            rows += compare(known[name], ranks, model_fn)
    print(f"{'case':<6} {'rank':>4} {'what':<26} {'model':>12} {'real':>12} {'diff':>10}")
    for r in rows:
        print(f"{r['case']:<6} {r['rank']:>4} {r['what']:<26} {r['model_bytes']:>12,} "
              f"{r['real_bytes']:>12,} {r['diff_bytes']:>+10,}")
    result = {"model_fn": a.model_fn, "rows": rows, "raw": raw}
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=1) + "\n")
    if a.write:
        _write_doc(result)
    return 0


def _write_doc(result: dict) -> None:
    from importlib.metadata import version

    import torch

    from primus_ext.util.files import atomic_write_text
    by = {c.name: c for c in cases()}
    lines = ["# Memory: the model against real torchtitan tensors", "",
             f"Generated by `scripts/memory_torchtitan.py --write --model-fn "
             f"{result['model_fn']}` on {datetime.date.today().isoformat()} (torch "
             f"{torch.__version__}, torchtitan {version('torchtitan')}, CPU, gloo). Bytes "
             "per rank. Real: torchtitan's Trainer (CPU patches of `patches/`) after one "
             "step: parameters and gradients as local shards, AdamW state, and the "
             "storages autograd keeps after one microbatch's forward of the rank's "
             "stage. Model: the memory function named above, asked about the same "
             "layout as a primus-ext spec.", "",
             f"Model (all cases): a llama3 of {json.dumps(DIMS)}, sequence {SEQ}.", "",
             "The model answers for the semantics the spec selects. A spec without "
             "`framework=torchtitan` is a megatron-core layout (`parallel.fsdp=true` is "
             "megatron-core's FSDP: bf16 parameters, fp32 main gradients, an fp32 master "
             "copy in the optimizer state), so its rows differ from torchtitan's fp32 "
             "parameters and gradients by design; the real columns are torchtitan's either "
             "way.", ""]
    for name, ranks in result["raw"].items():
        c = by[name]
        lines += [f"## {name}: {c.what}", "",
                  f"Spec: `{' '.join(c.overrides)}`; torchtitan: `{' '.join(c.flags)}`", "",
                  "| rank | stage | what | model | real | model - real |",
                  "| ---: | ---: | --- | ---: | ---: | ---: |"]
        for r in result["rows"]:
            if r["case"] == name:
                lines.append(f"| {r['rank']} | {r['stage']} | {r['what']} | "
                             f"{r['model_bytes']:,} | {r['real_bytes']:,} | "
                             f"{r['diff_bytes']:+,} |")
        lines += ["", "Real, per rank: parameter dtypes, unsharded (all-gathered bf16) "
                  "parameters at the forward's peak and kept for backward, AdamW `step` "
                  "bytes, saved activations by scope:", ""]
        for i, g in enumerate(ranks):
            scopes = ", ".join(f"{k} {v:,}" for k, v in sorted(g["activation_by_scope"]
                                                                .items()))
            lines.append(f"- rank {i}: {', '.join(g['param_dtypes'])}; unsharded params "
                         f"at peak {g['unsharded_peak_fwd_bytes']:,}, kept "
                         f"{g['unsharded_param_bytes']:,}; step "
                         f"{g['optimizer_step_bytes']:,}; {scopes}")
        lines.append("")
        saved = ranks[0].get("first_block_saved", [])
        if saved:
            lines += [f"What the first block saves on rank 0 ({len(saved)} storages, "
                      f"{sum(x[3] for x in saved):,} B):", "",
                      "| producer | shape | dtype | bytes |", "| --- | --- | --- | ---: |"]
            lines += [f"| {p} | {tuple(sh)} | {dt} | {n:,} |" for p, sh, dt, n in saved]
            lines.append("")
    lines += [NAMED]
    out = ROOT / "docs" / "memory-torchtitan.md"
    atomic_write_text(out, "\n".join(lines))
    print(f"wrote {out}")


if __name__ == "__main__":
    sys.exit(main())
