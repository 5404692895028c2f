"""The downscaler: from a target RunSpec and the local devices, a run that fits them and
measures what each target rank computes.

Rules (each applied one is named in ``Downscaled.rules``, and saved in the profile):

- ``layers``: a few decoder layers of each kind the target has (dense, MoE), dense
  first (``moe_first_k_dense``), MoE after (``moe_layer_freq=1``); the embedding and the
  output layer with the loss are always built (pp=1 puts both on the one stage);
  ``mtp_num_layers=0`` (MTP is priced from the layer kinds).
- ``pp``: pipeline parallelism flattened to one stage (vpp 1, no uneven layout); the
  schedule is restored by the projector's event simulation.
- ``tp``: capped to the largest divisor of the target tp the local devices hold; heads,
  query groups, the dense FFN and the vocabulary shrink by the same factor, hidden size
  and head dim stay, so every rank's GEMMs and attention have the target's per-rank
  shapes. Under SP the norms and residuals of the target see ``s/tp`` tokens per rank and
  the local run ``s/tp_local`` (rule ``sp_tokens``, restored by the projector).
- ``ep`` / ``etp``: capped the same way (experts use expert-tensor parallelism over the
  same ranks, megatron-core's MoE parallel folding); experts per rank stay, so routed
  tokens per expert and per rank are the target's; the expert FFN shrinks with etp. If
  that leaves no more experts than the router's top-k (every token would go to every
  expert: no routing, fixed shapes), experts are raised to 2 x top-k, at most the
  target's (rule ``experts_topk``: same expert FLOPs per rank, smaller per-expert GEMMs).
- ``cp``: capped as tp; the sequence stays (rule ``cp`` if reduced: the attention of a
  rank then sees more keys and the projector rescales it).
- ``dp``: 1, unless the expert axes need more ranks than tp*cp (then the attention part
  runs data-parallel, as it would in the target).
- ``batch``: the target's micro-batch size and sequence; ``num_microbatches`` per step.
- ``seq`` / ``vocab`` (when the measurement plan asks, ``measure/plan.py``): a shorter
  sequence (per-token parts rescaled by tokens, core attention on its own ratio) and a
  slice of the vocabulary (embedding and output layer rescaled by shape), both restored
  by the projector's simulate-backend ratios on the measuring hardware.
- ``recompute``: the target's setting is kept for the activation count (full recompute as
  ``uniform`` with one layer per unit: every layer checkpointed); layer timing runs
  without recompute, and the projector prices recompute from the measured forward.
  ``moe_act`` is left out of the measured model's modules (rule ``recompute_moe_act``).
"""
from __future__ import annotations

from dataclasses import dataclass
from math import gcd

from primus_ext.presets.overrides import apply_overrides
from primus_ext.spec import RunSpec, padded_vocab


@dataclass(frozen=True, kw_only=True, slots=True)
class Downscaled:
    spec: RunSpec
    overrides: tuple[str, ...]  # applied on top of the target's overrides
    rules: tuple[str, ...]
    world_size: int


def _divisor_at_most(n: int, cap: int) -> int:
    return max(d for d in range(1, min(n, cap) + 1) if n % d == 0)


def _lcm(a: int, b: int) -> int:
    return a * b // gcd(a, b)


def layer_counts(spec: RunSpec) -> tuple[int, int]:
    """(dense, MoE) decoder layers of the model."""
    moe = spec.model.num_moe_layers
    return spec.model.num_layers - moe, moe


def downscale(target: RunSpec, local_world: int, local_hardware: str, *,
              layers_per_kind: int = 2, num_microbatches: int = 2,
              seq_length: int | None = None, vocab_size: int | None = None) -> Downscaled:
    if local_world < 1:
        raise ValueError(f"local_world={local_world} must be >= 1")
    m, p, t = target.model, target.parallel, target.train
    rules: list[str] = []
    ov: list[str] = []

    tp_l = _divisor_at_most(p.tp, local_world)
    cp_l = _divisor_at_most(p.cp, local_world // tp_l)
    ep_l, etp_l = 1, 1
    if m.is_moe:
        etp_l = _divisor_at_most(p.expert_tp, local_world)
        ep_l = 1
        for d in range(p.ep, 0, -1):
            if p.ep % d == 0 and _lcm(tp_l * cp_l, d * etp_l) <= local_world:
                ep_l = d
                break
    world_l = _lcm(tp_l * cp_l, ep_l * etp_l)
    dp_l = world_l // (tp_l * cp_l)

    # Layers: a few of each kind, dense first.
    n_dense, n_moe = layer_counts(target)
    d_l, e_l = min(n_dense, layers_per_kind), min(n_moe, layers_per_kind)
    ov += [f"model.num_layers={d_l + e_l}", "model.mtp_num_layers=0"]
    if m.is_moe:
        ov += [f"model.moe_first_k_dense={d_l}", "model.moe_layer_freq=1"]
    rules.append(f"layers: {n_dense} dense + {n_moe} MoE -> {d_l} + {e_l} measured; "
                 "embedding and output+loss on the one stage"
                 + ("; MTP priced from the layer kinds" if m.mtp_num_layers else ""))

    # Tensor parallelism: keep per-rank shapes.
    r_tp = p.tp // tp_l
    if r_tp > 1:
        vocab_rank = padded_vocab(m.vocab_size, m.make_vocab_size_divisible_by, p.tp) // p.tp
        ov += [f"model.num_attention_heads={m.num_attention_heads // r_tp}",
               f"model.num_query_groups={max(m.num_groups // r_tp, 1)}",
               f"model.kv_channels={m.head_dim}",
               f"model.ffn_hidden_size={m.dense_ffn_size // r_tp}",
               f"model.vocab_size={vocab_rank * tp_l}"]
        if m.moe_shared_expert_intermediate_size:
            ov.append("model.moe_shared_expert_intermediate_size="
                      f"{m.moe_shared_expert_intermediate_size // r_tp}")
        rules.append(f"tp: {p.tp} -> {tp_l}; heads, query groups, FFN and vocabulary / "
                     f"{r_tp} keep the per-rank shapes")
        if p.sequence_parallel and tp_l == 1:
            rules.append(f"sp_tokens: norms/residuals see s tokens per rank here, s/{p.tp} "
                         "in the target (sequence parallelism)")
        elif p.sequence_parallel:
            rules.append(f"sp_tokens: norms/residuals see s/{tp_l} tokens per rank here, "
                         f"s/{p.tp} in the target")
    ov += [f"parallel.tp={tp_l}",
           f"parallel.sequence_parallel={'true' if p.sequence_parallel and tp_l > 1 else 'false'}"]

    if p.cp != cp_l:
        rules.append(f"cp: {p.cp} -> {cp_l}; the sequence is kept, attention rescaled")
    ov.append(f"parallel.cp={cp_l}")

    # Experts: keep experts per rank and the per-rank expert FFN.
    if m.is_moe:
        per_rank = m.num_moe_experts // p.ep
        experts_l = per_rank * ep_l
        if experts_l <= m.moe_router_topk < m.num_moe_experts:
            # Top-k of k experts sends every token to every expert: no routing, fixed
            # GEMM shapes, no imbalance. Keep a real choice (at least 2k experts, at most
            # the target's): same expert FLOPs per rank, smaller GEMMs per expert.
            want = min(m.num_moe_experts, 2 * m.moe_router_topk)
            experts_l = -(-want // ep_l) * ep_l
            while m.num_moe_experts % experts_l and experts_l < m.num_moe_experts:
                experts_l += ep_l
            rules.append(f"experts_topk: {per_rank * ep_l} experts <= top-k "
                         f"{m.moe_router_topk} would route every token to every expert; "
                         f"{experts_l} measured (same expert FLOPs per rank, smaller "
                         "GEMMs per expert, rescaled)")
        r_etp = p.expert_tp // etp_l
        ov += [f"model.num_moe_experts={experts_l}", f"parallel.ep={ep_l}",
               f"parallel.etp={etp_l}"]
        if r_etp > 1:
            ov.append(f"model.moe_ffn_hidden_size={m.expert_ffn_size // r_etp}")
        if p.ep != ep_l or r_etp > 1:
            rules.append(f"ep: {p.ep} -> {ep_l}, etp: {p.expert_tp} -> {etp_l}; "
                         f"{per_rank} experts per rank kept, expert FFN / {r_etp}")
    else:
        ov += ["parallel.ep=1", "parallel.etp=null"]

    if p.pp > 1 or p.vpp > 1:
        rules.append(f"pp: {p.pp} (vpp {p.vpp}) -> 1; the schedule is simulated")
    ov += ["parallel.pp=1", "parallel.vpp=1", "parallel.schedule=auto",
           "parallel.decoder_first_pipeline_num_layers=null",
           "parallel.decoder_last_pipeline_num_layers=null",
           "parallel.account_for_embedding_in_pipeline_split=false",
           "parallel.account_for_loss_in_pipeline_split=false",
           "parallel.pipeline_layout=null"]
    if target.dp != dp_l:
        rules.append(f"dp: {target.dp} -> {dp_l}; data-parallel sync is simulated")

    if vocab_size is not None:
        per_rank = padded_vocab(m.vocab_size, m.make_vocab_size_divisible_by, p.tp) // p.tp
        v_l = padded_vocab(vocab_size, m.make_vocab_size_divisible_by, tp_l)
        if v_l < per_rank * tp_l:
            ov.append(f"model.vocab_size={v_l}")
            rules.append(f"vocab: {m.vocab_size} -> {v_l} measured (a slice); embedding "
                         "and output layer rescaled by their shapes")
    if seq_length is not None and seq_length < t.seq_length:
        ov += [f"train.seq_length={seq_length}"]
        rules.append(f"seq: {t.seq_length} -> {seq_length} tokens measured; per-token "
                     "parts (GEMMs, norms, residuals) rescaled by tokens, core attention "
                     "by its own (quadratic) ratio")
    # Batch: the target's microbatch, a few microbatches per step.
    ov += [f"train.global_batch_size={t.micro_batch_size * dp_l * num_microbatches}"]
    if t.recompute_granularity == "full":
        ov += ["train.recompute_method=uniform", "train.recompute_num_layers=1"]
        rules.append("recompute: full recompute counted with one layer per unit; layer "
                     "times measured without recompute, recompute priced as a forward")
    elif t.recompute_granularity == "selective":
        rules.append("recompute: selective recompute priced from the measured core "
                     "attention forward")
        if "moe_act" in t.recompute_modules:
            # The measured experts are megatron-core's SequentialMLP (model.py builds no
            # grouped GEMM), and TransformerConfig accepts moe_act only with
            # moe_grouped_gemm. The target's memory and recompute come from its spec.
            kept = [x for x in t.recompute_modules if x != "moe_act"]
            ov += ([f"train.recompute_modules=[{','.join(kept)}]"] if kept
                   else ["train.recompute_granularity=null"])
            rules.append("recompute_moe_act: not built in the measured model (sequential "
                         "experts; megatron-core recomputes moe_act only with a grouped "
                         "GEMM); the target's memory model and recompute price count it")

    if t.precision == "fp8":
        rules.append("fp8: measured in bf16 (no FP8 autocast); GEMMs rescaled by the "
                     "simulate backend's fp8/bf16 ratio")
    if m.moe_router_num_groups is not None:
        # Group-limited routing picks which experts, not how many per token: the
        # per-rank work is the same without it, and fewer experts may not divide.
        ov += ["model.moe_router_num_groups=null", "model.moe_router_group_topk=null"]
    ov += [f"cluster.hardware={local_hardware}", "cluster.num_nodes=1",
           f"cluster.gpus_per_node={world_l}"]
    spec = apply_overrides(target, ov)
    return Downscaled(spec=spec, overrides=tuple(ov), rules=tuple(rules),
                      world_size=world_l)
