"""Megatron-LM model-shape flags -> ModelSpec (pure): activation, positions, vocabulary,
MoE layer pattern, sliding window, MLA and MTP, with Megatron-LM's defaults."""
from __future__ import annotations

import math
import re

from primus_ext.frameworks.megatron.line_flags import router_groups
from primus_ext.frameworks.megatron.vocab import resolve_vocab
from primus_ext.spec import ModelSpec


def moe_pattern(freq: str | None, num_layers: int) -> tuple[int, int]:
    """(moe_layer_freq, moe_first_k_dense) from --moe-layer-freq (int or 0/1 list)."""
    if freq is None:
        return 1, 0
    s = freq.strip()
    if re.fullmatch(r"\d+", s):
        return int(s), 0
    if "*" in s:  # Megatron-LM's "([0]*3+[1]*58)"
        pattern: list[int] = []
        for val, rep in re.findall(r"\[(\d)\]\s*\*\s*(\d+)", s):
            pattern += [int(val)] * int(rep)
    else:
        pattern = [int(x) for x in re.findall(r"\d", s)]
    if len(pattern) != num_layers:
        raise ValueError(f"--moe-layer-freq {freq!r} has {len(pattern)} entries for "
                         f"--num-layers {num_layers}")
    k = next((i for i, v in enumerate(pattern) if v), num_layers)
    rest = pattern[k:]
    for f in range(1, len(rest) + 1):
        if rest == [1 if i % f == 0 else 0 for i in range(len(rest))]:
            return f, k
    raise ValueError(f"--moe-layer-freq {freq!r}: only 'k dense layers, then every f-th "
                     "layer MoE' patterns are modelled")


def activation(ns) -> str:
    """megatron/training/arguments.py core_transformer_config_from_args: --swiglu (SiLU,
    gated), --quick-geglu (x * sigmoid(1.702 x), gated), --squared-relu; else GeLU."""
    given = [f for f, v in (("--swiglu", ns.swiglu), ("--quick-geglu", ns.quick_geglu),
                            ("--squared-relu", ns.squared_relu)) if v]
    if len(given) > 1:
        raise ValueError(f"{' and '.join(given)}: one MLP activation at a time "
                         "(Megatron-LM asserts 'not args.swiglu' for the others)")
    return {"--swiglu": "swiglu", "--quick-geglu": "quick_geglu",
            "--squared-relu": "squared_relu"}.get(given[0] if given else "", "gelu")


def position_embedding(ns, notes) -> str:
    """Megatron-LM validate_args: --use-rotary-position-embeddings means rope;
    --no-position-embedding is a no-op with rope. Without rope, Megatron-LM main refuses
    it ('deprecated, use --position-embedding-type'); older releases read it as no
    position embedding, which is taken here with a note. mrope and yarn are RoPE with
    the same FLOPs; Megatron-LM runs them unfused (train.apply_rope_fusion, args.py)."""
    kind = ns.position_embedding_type
    if ns.use_rotary_position_embeddings:
        kind = "rope"
    if kind == "relative":
        raise ValueError("--position-embedding-type relative is T5's; pretrain_gpt.py "
                         "models use learned_absolute, rope, alibi or none")
    if not ns.add_position_embedding and kind != "rope":
        notes.notes.append("--no-position-embedding read as --position-embedding-type "
                           "none (Megatron-LM main refuses it: use "
                           "--position-embedding-type)")
        kind = "none"
    return "rope" if kind in ("mrope", "yarn") else kind


def ffn_hidden_size(ns) -> int | None:
    """--ffn-hidden-size, or Megatron-LM's default without it (megatron/training/
    arguments.py validate_args: ``int((4 * h * 2 / 3) / 64) * 64`` with --swiglu; None,
    the spec's 4 * h, otherwise)."""
    if ns.ffn_hidden_size is None and ns.swiglu:
        return int((4 * ns.hidden_size * 2 / 3) / 64) * 64
    return ns.ffn_hidden_size


def vocab_divisor(ns, size: int, padded: bool, notes) -> int:
    """--make-vocab-size-divisible-by, or under --padded-vocab-size the largest divisor of
    it that pads nothing (Megatron-LM takes the padded size as given). The embedding is
    split over TP rows (megatron-core VocabUtility ``divide``), so TP must divide it."""
    d = ns.make_vocab_size_divisible_by
    if not padded:
        return d
    tp = ns.tensor_model_parallel_size
    if size % tp:
        raise ValueError(f"--padded-vocab-size {size} is not divisible by "
                         f"--tensor-model-parallel-size {tp} (megatron-core's "
                         "VocabParallelEmbedding splits the vocabulary over TP: divide)")
    if size % (d * tp):
        d = math.gcd(d, size // tp)
    return d


def model_spec(ns, name: str | None, notes) -> ModelSpec:
    L = ns.num_layers
    freq, first_k = moe_pattern(ns.moe_layer_freq, L) if ns.num_experts else (1, 0)
    window, every = None, 1
    if ns.window_size:
        window = int(str(ns.window_size).split(",")[0])
        every = ns.window_attn_skip_freq or 1
    vocab = resolve_vocab(tokenizer_type=ns.tokenizer_type, vocab_size=ns.vocab_size,
                          tokenizer_model=ns.tokenizer_model, vocab_file=ns.vocab_file,
                          padded_vocab_size=ns.padded_vocab_size,
                          patch_tokenizer_type=ns.patch_tokenizer_type,
                          extra_vocab_size=ns.extra_vocab_size)
    if ns.tokenizer_type != "NullTokenizer" or ns.vocab_size is None:
        notes.notes.append(f"vocabulary: {vocab.how}")
    groups, group_topk = router_groups(ns, notes)
    return ModelSpec(
        moe_router_num_groups=groups, moe_router_group_topk=group_topk,
        moe_expert_capacity_factor=ns.moe_expert_capacity_factor,
        moe_pad_expert_input_to_capacity=ns.moe_pad_expert_input_to_capacity,
        name=name or ns.model_name or f"gpt-{L}l-{ns.hidden_size}h",
        num_layers=L, hidden_size=ns.hidden_size,
        num_attention_heads=ns.num_attention_heads, ffn_hidden_size=ffn_hidden_size(ns),
        num_query_groups=ns.num_query_groups if ns.group_query_attention else None,
        kv_channels=ns.kv_channels, vocab_size=vocab.size,
        make_vocab_size_divisible_by=vocab_divisor(ns, vocab.size, vocab.padded, notes),
        max_position_embeddings=ns.max_position_embeddings or ns.seq_length,
        normalization=ns.normalization, activation=activation(ns),
        add_bias_linear=not ns.disable_bias_linear, add_qkv_bias=ns.add_qkv_bias,
        qk_layernorm=ns.qk_layernorm, position_embedding_type=position_embedding(ns, notes),
        rotary_percent=ns.rotary_percent,
        activation_func_clamp_value=ns.activation_func_clamp_value,
        untie_embeddings_and_output_weights=ns.untie_embeddings_and_output_weights,
        hidden_dropout=ns.hidden_dropout, attention_dropout=ns.attention_dropout,
        window_size=window, window_full_attention_every=every,
        num_moe_experts=ns.num_experts, moe_router_topk=ns.moe_router_topk,
        moe_ffn_hidden_size=ns.moe_ffn_hidden_size,
        moe_shared_expert_intermediate_size=ns.moe_shared_expert_intermediate_size,
        moe_layer_freq=freq, moe_first_k_dense=first_k,
        multi_latent_attention=ns.multi_latent_attention, q_lora_rank=ns.q_lora_rank,
        # Megatron-LM's --kv-lora-rank default is 32 (core_v0.16.1 arguments.py:2727);
        # without MLA the field is unused and keeps the spec's default.
        **({"kv_lora_rank": ns.kv_lora_rank} if ns.multi_latent_attention else {}),
        qk_head_dim=ns.qk_head_dim,
        qk_pos_emb_head_dim=ns.qk_pos_emb_head_dim, v_head_dim=ns.v_head_dim,
        mtp_num_layers=ns.mtp_num_layers or 0)
