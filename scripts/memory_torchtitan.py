#!/usr/bin/env python
"""The memory model against what real torchtitan models allocate and save on this CPU.

For each case (FSDP2 over 2 processes, TP 2, PP 2 with 1F1B; a tiny llama3), torchtitan's
own Trainer runs under torchrun with the CPU patches and every rank counts its parameters,
gradients, optimizer state and the activations one microbatch's forward saves
(``primus_ext.frameworks.torchtitan.measure_memory``). The memory model is any function
``spec -> MemoryReport`` (``--model-fn module:function``), asked about the same layout
as a ``framework=torchtitan`` spec (``parallel.dp_shard`` for FSDP2); the default
``primus_ext:memory`` is ``memory_report``, which answers such a spec with the torchtitan
memory model (``primus_ext.memory.torchtitan``). Rank r is compared with stage
``r // (ranks per stage)``; the CPU-only part of each real figure is named from the real
records, so a zero residual is a byte match.

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
    base = ["framework=torchtitan", "model=tiny_dense",
            f"model.num_layers={d['num_layers']}",
            f"model.hidden_size={d['hidden_size']}",
            f"model.num_attention_heads={d['num_attention_heads']}",
            f"model.num_query_groups={d['num_query_groups']}",
            f"model.ffn_hidden_size={d['ffn_hidden_size']}",
            f"model.vocab_size={d['vocab_size']}", f"train.seq_length={SEQ}",
            "cluster.hardware=cpu", "cluster.num_nodes=1", "cluster.gpus_per_node=2"]
    tt = ["--training.seq_len", str(SEQ)]
    return [
        Case("fsdp2", tuple(base + ["parallel.dp_shard=2", "train.micro_batch_size=2",
                                    "train.global_batch_size=4"]),
             tuple(tt + ["--parallelism.data_parallel_shard_degree", "2",
                         "--training.local_batch_size", "2"]),
             "FSDP2 over 2 processes, micro batch 2"),
        Case("tp2", tuple(base + ["parallel.dp_shard=1", "parallel.tp=2",
                                  "parallel.sequence_parallel=true",
                                  "train.micro_batch_size=2", "train.global_batch_size=2"]),
             tuple(tt + ["--parallelism.data_parallel_shard_degree", "1",
                         "--parallelism.tensor_parallel_degree", "2",
                         "--training.local_batch_size", "2"]),
             "TP 2 with SP, micro batch 2"),
        Case("pp2", tuple(base + ["parallel.dp_shard=1", "parallel.pp=2",
                                  "parallel.schedule=1F1B",
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
    cmd = _torchrun(2) + ["-m", "primus_ext.frameworks.torchtitan.measure_memory",
                          "--out", str(out), "--model-dims", json.dumps(DIMS),
                          "--assets", str(tmp / "assets"), *REGISTRY, *case.flags,
                          "--training.steps", "1", "--metrics.log_freq", str(10 ** 6),
                          "--dump_folder", str(tmp / "dump"), "activation-checkpoint:none"]
    # A rank of torch 2.13's CPU/gloo runs now and then aborts while the process exits
    # ("terminate called without an active exception"): such a run is discarded whole
    # (its file removed) and run once more; only a run whose every rank exits 0 counts.
    for attempt in (1, 2):
        out.unlink(missing_ok=True)
        try:
            _run(cmd, timeout=900)
            break
        except RuntimeError as err:
            if attempt == 2:
                raise
            print(f"{case.name}: the run failed, running it again:\n{str(err)[-600:]}",
                  file=sys.stderr)
    return json.loads(out.read_text())["ranks"]


def load_model_fn(name: str):
    mod, _, fn = name.partition(":")
    if not fn:
        raise SystemExit(f"--model-fn={name!r} must be module:function")
    return getattr(importlib.import_module(mod), fn)


def _norm_cpu_extra(ranks_rank: dict, first_block: list) -> int:
    """Bytes the CPU's composite RMSNorm saves beyond a fused GPU kernel, on one rank:
    per norm the fp32 input copy (``ToCopyBackward0``) and the fp32 product
    (``MulBackward0``) instead of the bf16 input (half the copy's bytes); the rstd is
    saved either way. Read off the first block's storages (two norms), the final norm
    counted as one norm of the same shape."""
    copy = sum(n for p, _, dt, n in first_block if p == "ToCopyBackward0" and dt == "float32")
    prod = sum(n for p, _, dt, n in first_block if p == "MulBackward0" and dt == "float32")
    per_norm = (copy + prod - copy // 2) // 2
    scopes = ranks_rank["activation_by_scope"]
    blocks = sum(1 for k in scopes if k.startswith("layer."))
    return per_norm * (2 * blocks + (1 if "final_norm" in scopes else 0))


def compare(case: Case, ranks: list[dict], model_fn) -> list[dict]:
    """One row per rank and category: the model's bytes, the real ones counted in the
    same scope, and the named CPU-only part of the real figure (``cpu_only_bytes``:
    real on this CPU minus what the same code keeps on a GPU, from the real records);
    ``residual_bytes`` = model - (real - cpu_only): zero is a byte match."""
    import primus_ext
    spec = primus_ext.compose(list(case.overrides))
    report = model_fn(spec)
    per_stage = max(len(ranks) // spec.parallel.pp, 1)
    first_block = ranks[0].get("first_block_saved", [])
    rows = []
    for r, got in enumerate(ranks):
        st = report.stages[min(r // per_stage, len(report.stages) - 1)]
        # Without PP FSDP2 reshards after forward and, on a GPU, prefetches the next
        # block while this one computes (implicit forward prefetch): two blocks in
        # flight. CPU compute is synchronous: one at a time, so the measured peak holds
        # one block fewer -- a block of the size measured (the peak is one block).
        no_prefetch = -got["unsharded_peak_fwd_bytes"] if spec.parallel.pp == 1 else 0
        for what, model_v, real_v, cpu, note in (
                ("parameters", st.param_bytes,
                 got["param_bytes"] + got["unsharded_peak_fwd_bytes"], no_prefetch,
                 "fp32 shards + bf16 gathered at the forward's peak"),
                ("gradients", st.grad_bytes, got["grad_bytes"], 0,
                 "fp32 shards after the step (backward transients not measured)"),
                ("optimizer state", st.optimizer_bytes,
                 got["optimizer_bytes"] + got["optimizer_step_bytes"], 0,
                 "AdamW moments + step"),
                ("activations / microbatch", st.activation_bytes_per_microbatch,
                 got["activation_bytes"], _norm_cpu_extra(got, first_block),
                 "saved by one microbatch's forward")):
            rows.append({"case": case.name, "rank": r, "stage": st.stage, "what": what,
                         "model_bytes": int(model_v), "real_bytes": int(real_v),
                         "diff_bytes": int(model_v) - int(real_v),
                         "cpu_only_bytes": int(cpu),
                         "residual_bytes": int(model_v) - int(real_v) + int(cpu),
                         "real_scope": note})
    return rows


NAMED = """## Named differences

CPU-only (column "CPU only": the real figure on this CPU minus what the same code keeps
on a GPU, taken from the real records):

- **Blocks in flight.** Without PP, FSDP2 reshards after forward and on a GPU prefetches
  the next block while this one computes (implicit forward prefetch: the all-gather is
  issued on its own stream), so two blocks' bf16 parameters are gathered at the peak.
  CPU compute is synchronous: one block at a time here (`unsharded params at peak`
  below is one block), so the real peak holds one block fewer.
- **RMSNorm.** torch 2.13's CPU `rms_norm` is composite: each norm saves its input cast
  to fp32 (`ToCopyBackward0`), the fp32 product (`MulBackward0`) and the fp32 `rsqrt`
  statistics; a fused GPU kernel (`aten._fused_rms_norm`) saves its bf16 input and the
  statistics. Per norm the CPU keeps 6 B per element more (8 instead of 2).
- **Attention.** On this CPU FlexAttention is replaced by SDPA (patches/torchtitan_sdpa.py);
  the CPU's fused SDPA kernel saves the output and the log-sum-exp as flash attention
  does on a GPU (no difference in bytes).
- **Selective checkpointing** (not run on this page; `tests/torchtitan/
  test_titan_act_tensors.py` runs torchtitan's `SelectiveAC` on a real block): the CPU's
  SDPA kernel (`_scaled_dot_product_flash_attention_for_cpu`) is not in torchtitan's save
  list (`_get_default_save_ops`) while the GPU's flash kernel is, so on this CPU SDPA's
  output and log-sum-exp are recomputed instead of saved.

Not CPU-only (the scope of the measurement, and terms the model takes from the source):

- **Gradients in backward are not measured.** The real count is taken after the step:
  the fp32 gradient shards. The model's gradient figure adds the backward's transients
  (one unit's unsharded bf16 gradient and the fp32 copy the reduce-scatter reads; under
  PP the stage's unsharded fp32 gradients accumulated over microbatches), which this
  script does not count; the gradient rows' residual is that term, unverified here.
- **Attention projections.** torchtitan 0.3.0 builds every llama3 with a fused `wqkv`
  (`models/llama3/__init__.py`, `fuse_qkv=True`), but `FusedQKVLinear.forward`
  (`models/common/attention.py`, `_split`) copies Q, K and V out of its output
  (`.contiguous()`), so the fused output is not kept: SDPA keeps the rotated Q and K
  and the copied V (`TransposeBackward0` rows above). The model counts these three.
- **RoPE cache.** `ComplexRoPE` gathers its complex64 cache by the batch's positions
  (`models/common/rope.py`, `_reshape_for_broadcast`; torchtitan's text datasets always
  yield `positions`), a new `(batch, seq, 1, head_dim/2)` tensor in every block that the
  rotation's complex product saves (the `no_grad` complex64 row above): `b*s*head_dim/2*8`
  bytes per block, counted by the model.
- **Embedding under TP.** torchtitan's vocab-parallel `Embedding.forward`
  (`models/common/embedding.py`) multiplies its output by the vocab mask cast to the
  compute dtype; the product saves the mask (`b*s*2` bytes, 384 B in tp2) beside the
  shifted int64 ids. Counted by the model when `tp > 1`.
- **The output layer and the loss.** torchtitan's `ChunkedLossWrapper` runs the lm_head
  inside the loss, chunk by chunk, outside the model's forward: the activation count
  (one forward of the model part) holds the final norm but no logits (as the model).

A non-zero activation residual is not accounted for; the per-scope figures locate it.
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
    print(f"{'case':<6} {'rank':>4} {'what':<26} {'model':>12} {'real':>12} {'diff':>10} "
          f"{'CPU only':>10} {'residual':>10}")
    for r in rows:
        print(f"{r['case']:<6} {r['rank']:>4} {r['what']:<26} {r['model_bytes']:>12,} "
              f"{r['real_bytes']:>12,} {r['diff_bytes']:>+10,} {r['cpu_only_bytes']:>+10,} "
              f"{r['residual_bytes']:>+10,}")
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
             "Each spec is `framework=torchtitan`, so the model is torchtitan's memory "
             "model (`primus_ext.memory.torchtitan`, what `memory_report` returns for "
             "such a spec). Columns: *model*; *real*, counted in the scope named in the "
             "last column; *CPU only*, the part of the real figure this CPU adds (+) or "
             "lacks (-) against the same code on a GPU, from the real records (see Named "
             "differences); *residual* = model - (real - CPU only): 0 is a byte match "
             "once the CPU-only differences are named.", ""]
    for name, ranks in result["raw"].items():
        c = by[name]
        lines += [f"## {name}: {c.what}", "",
                  f"Spec: `{' '.join(c.overrides)}`; torchtitan: `{' '.join(c.flags)}`", "",
                  "| rank | stage | what | model | real | model - real | CPU only | "
                  "residual | real counts |",
                  "| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | --- |"]
        for r in result["rows"]:
            if r["case"] == name:
                lines.append(f"| {r['rank']} | {r['stage']} | {r['what']} | "
                             f"{r['model_bytes']:,} | {r['real_bytes']:,} | "
                             f"{r['diff_bytes']:+,} | {r['cpu_only_bytes']:+,} | "
                             f"{r['residual_bytes']:+,} | {r['real_scope']} |")
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
