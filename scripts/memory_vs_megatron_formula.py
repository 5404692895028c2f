"""Our per-GPU memory next to Megatron-LM's theoretical formula, for large presets.

Megatron-LM's ``megatron/training/theoretical_memory_usage.py``
(``report_theoretical_memory``, printed by the training loop) estimates the most loaded
rank as weights + optimizer (``compute_weight_and_optimizer_memory``) plus activations
(``compute_activation_memory`` with SP and selective recompute, else
``compute_activation_memory_without_sp``). The formula is re-derived below from its
published terms (not imported: ``megatron.training`` is not in the py3.11 wheel), next
to ``primus_ext.memory``'s figure for the same rank (pipeline stage 0, the one the
formula describes) and the peak over stages. ``--write`` also writes
docs/memory-vs-formula.md with the table and where the two differ.

Usage: python scripts/memory_vs_megatron_formula.py [--write]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from primus_ext.memory.report import memory_report  # noqa: E402
from primus_ext.presets import hardware_preset, model_preset  # noqa: E402
from primus_ext.spec import (ClusterSpec, ModelSpec, ParallelSpec, RunSpec, TrainSpec,  # noqa: E402
                             padded_vocab)

GIB = 2 ** 30


# ---- Megatron-LM's theoretical formula, term by term ---------------------------------
def formula_params(spec: RunSpec) -> tuple[float, float]:
    """(parameters on the most loaded shard, bytes per parameter)."""
    m, p = spec.model, spec.parallel
    h, L = m.hidden_size, m.num_layers
    gated = 1.5 if m.gated else 1.0
    norm = 1 if m.normalization == "RMSNorm" else 2
    pattern = [1 if m.is_moe_layer(i) else 0 for i in range(L)]
    n_moe = sum(pattern)
    if m.multi_latent_attention:
        qk = m.qk_head_dim + m.qk_pos_emb_head_dim
        q = (h * m.num_attention_heads * qk if m.q_lora_rank is None else
             m.q_lora_rank * (h + m.num_attention_heads * qk + norm))
        attn = (q + m.kv_lora_rank * (h + m.num_attention_heads * (m.qk_head_dim + m.v_head_dim)
                                      + norm)
                + h * m.qk_pos_emb_head_dim + m.num_attention_heads * m.v_head_dim * h)
    else:
        ratio = m.head_dim * m.num_attention_heads / h
        attn = 2 * h * h * (1 + m.num_groups / m.num_attention_heads) * ratio
    dense_layer = 2 * h * (m.dense_ffn_size * gated + norm) + attn
    shared = m.moe_shared_expert_intermediate_size or 0
    experts = m.num_moe_experts or 1
    moe_layer = 2 * h * ((m.expert_ffn_size * experts + shared) * gated + norm) + attn
    vocab = padded_vocab(m.vocab_size, m.make_vocab_size_divisible_by, p.tp)
    emb = h * vocab
    block = dense_layer * (L - n_moe) + moe_layer * n_moe + norm * h
    mtp = m.mtp_num_layers * (moe_layer if pattern[-1] else dense_layer)
    shard = (block / p.pp + mtp + emb) / p.tp
    if m.untie_embeddings_and_output_weights and p.pp == 1:
        shard += emb / p.tp
    per_param = 6 + 12 / spec.dp if p.use_distributed_optimizer else 18
    return shard, per_param


def formula_activations(spec: RunSpec) -> float:
    m, p, t = spec.model, spec.parallel, spec.train
    s, b, h, L = t.seq_length, t.micro_batch_size, m.hidden_size, m.num_layers
    vocab = padded_vocab(m.vocab_size, m.make_vocab_size_divisible_by, p.tp)
    with_sp = p.sequence_parallel and t.recompute_granularity == "selective"
    if with_sp:
        act = s * b * h * (18 + 4 * m.dense_ffn_size / h) * L
    else:
        act = s * b * h * (10 + 24 / p.tp) * L
    act += 8 * s * b * p.pp + s * b * h * p.pp  # embedding input and dropout
    if p.vpp > 1:
        act *= 1 + (p.pp - 1) / (p.pp * p.vpp)
    elif p.pp > 1:
        act *= min(1, spec.num_microbatches / p.pp)
    if p.pp == 1:
        act += (s * b * h * 4 * (1 + vocab / h) if with_sp
                else (s * b * vocab / p.tp + s * b * h) * 2)
    return act / p.tp if with_sp else act * 1.05


# ---- presets ------------------------------------------------------------------------
def _spec(model: str, nodes: int, seq: int, gbs: int, mbs: int = 1, hw: str = "h100",
          recompute: str | None = "selective", **par) -> RunSpec:
    full = recompute == "full"
    return RunSpec(
        model=ModelSpec(**model_preset(model)), parallel=ParallelSpec(**par),
        train=TrainSpec(seq_length=seq, micro_batch_size=mbs, global_batch_size=gbs,
                        recompute_granularity=recompute,
                        recompute_method="uniform" if full else None,
                        recompute_num_layers=1 if full else None),
        cluster=ClusterSpec(hardware=hardware_preset(hw), num_nodes=nodes))


PRESETS = [
    ("GPT-3 175B, 1024 H100, TP8 PP8 VPP2 SP, selective",
     _spec("gpt3_175b", 128, 2048, 1536, tp=8, pp=8, vpp=2, sequence_parallel=True)),
    ("Llama-3 70B, 512 H100, TP8 PP4 SP, selective",
     _spec("llama3_70b", 64, 8192, 512, tp=8, pp=4, sequence_parallel=True)),
    ("Llama-3.1 405B, 2048 H100, TP8 PP16 SP, selective",
     _spec("llama3.1_405b", 256, 8192, 1024, tp=8, pp=16, sequence_parallel=True)),
    ("Mixtral 8x7B, 128 H100, TP2 PP4 EP8 SP, selective",
     _spec("mixtral_8x7b", 16, 4096, 1024, tp=2, pp=4, ep=8, sequence_parallel=True)),
    ("DeepSeek-V3, 1024 H100, PP16 EP64, full recompute",
     _spec("deepseek_v3", 128, 4096, 8192, pp=16, ep=64, recompute="full")),
]

EXPLANATION = """
## Where the two differ, and why

1. **Which rank.** The formula describes one "most loaded" rank: 1/pp of the decoder,
   the whole embedding and *all* MTP layers, divided by TP. We compute every pipeline
   stage from the actual layer placement (uneven layouts, the tied-embedding copy
   megatron-core allocates on the last stage when pp > 1, MTP and the output layer on the
   last stage) and report stage 0 here next to the peak over stages.
2. **Replicated parameters.** The formula divides every parameter by TP; norms, the MoE
   router and (with the TE spec) MLA's down projections are replicated over TP and we
   count them whole on every rank.
3. **Expert parameters.** The formula keeps *every* routed expert on every rank (its
   most-loaded shard is not divided by EP), which is why it is off by 4-20x for Mixtral
   and DeepSeek-V3 above, and it shards their optimizer state over dp like dense
   weights. megatron-core splits experts over EP and expert-TP and shards their optimizer
   state over the *expert*-data-parallel ranks (world / (pp x ep x etp)): with EP = 64 on
   1024 GPUs and PP16 (DeepSeek-V3) that is 1, so each rank keeps the fp32 master weights
   and Adam moments of its own experts in full. Experts also get their own DDP buffer.
4. **Padding.** The distributed optimizer pads every parameter to 64 elements and every
   bucket to lcm(dp, 128) elements (`param_and_grad_buffer.py`); we reproduce the layout
   exactly, the formula ignores it (a fraction of a percent).
5. **Activations per layer.** The formula is Korthikanti et al.'s GPT layer:
   `sbh (18 + 4 ffn/h) / t` with SP + selective, `sbh (10 + 24/t)` otherwise (no
   recompute distinction, no s^2 terms, +5%). It has no GQA (K/V are smaller), no SwiGLU
   (fc1 is 2 x ffn wide and the fused activation saves its input), no MoE (each token's
   top-k expert FFNs, the dispatched tokens, the router), no MLA, no RMSNorm, uses the
   dense FFN width for MoE layers, and ignores full recompute (which keeps only each
   layer's input). We itemise every tensor megatron-core saves, per layer kind.
6. **In-flight microbatches.** The formula takes pp microbatches of all L/pp layers
   (times 1 + (pp-1)/(pp vpp) with interleaving). We follow the schedule per stage:
   min(pp - stage, m) for 1F1B, megatron-core's warmup count per chunk for interleaved,
   and add one backward's transient working set (a recompute unit, the bf16 logits).
7. **Output layer and loss.** The formula adds them only when pp = 1; we put them (fp32
   softmax of the vocab-parallel cross entropy: 4 bytes x s x b x V/t) on the last stage.
8. **Non-model memory.** The formula has none; we add the CUDA context, GEMM workspaces,
   NCCL buffers per communicator, megatron-core's global all-gather buffer and allocator
   fragmentation (MemoryOptions, documented defaults), so our total is what a GPU would
   show, not only tensors.
"""


def rows() -> list[tuple]:
    out = []
    for name, spec in PRESETS:
        rep = memory_report(spec)
        s0 = rep.stages[0]
        params, per_param = formula_params(spec)
        w_opt = params * per_param
        act = formula_activations(spec)
        ours_w = s0.param_bytes + s0.grad_bytes + s0.optimizer_bytes
        out.append((name, params, s0.num_params, w_opt, ours_w, act, s0.activation_bytes,
                    w_opt + act, s0.total_bytes, rep.peak_bytes, rep.worst_stage))
    return out


def table() -> str:
    lines = ["| run | params/rank formula | ours (stage 0) | weights+opt formula GiB | "
             "ours GiB | activations formula GiB | ours GiB | total formula GiB | "
             "ours stage 0 GiB | ours peak GiB (stage) |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for (name, p_f, p_o, w_f, w_o, a_f, a_o, t_f, t_o, peak, worst) in rows():
        lines.append(f"| {name} | {p_f / 1e9:.2f} B | {p_o / 1e9:.2f} B | {w_f / GIB:.1f} | "
                     f"{w_o / GIB:.1f} | {a_f / GIB:.1f} | {a_o / GIB:.1f} | "
                     f"{t_f / GIB:.1f} | {t_o / GIB:.1f} | {peak / GIB:.1f} ({worst}) |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="write docs/memory-vs-formula.md")
    args = ap.parse_args()
    text = ("# Our memory model vs Megatron-LM's theoretical formula (generated)\n\n"
            "Generated by `scripts/memory_vs_megatron_formula.py --write`; do not edit by "
            "hand.\n\nPer-GPU bytes of the rank the formula describes (pipeline stage 0) "
            "and our peak over stages. bf16, distributed optimizer, attention_backend "
            "flash, default MemoryOptions.\n\n" + table() + EXPLANATION)
    print(text)
    if args.write:
        path = ROOT / "docs" / "memory-vs-formula.md"
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
