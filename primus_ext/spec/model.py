"""ModelSpec: the architecture of a decoder-only transformer.

Field names follow megatron-core's ``TransformerConfig`` (and Megatron-LM's flags), so a
recipe maps one-to-one onto a launch line.
"""
from __future__ import annotations

from dataclasses import dataclass

from primus_ext.spec._check import check_types, divides, non_negative, one_of, positive

_OWNER = "model"
NORMALIZATIONS = ("RMSNorm", "LayerNorm")
POSITION_EMBEDDINGS = ("rope", "learned_absolute", "alibi", "none")
# quick_geglu: GPT-OSS's gated x * sigmoid(1.702 x) (Megatron-LM --quick-geglu,
# megatron/core/activations.py quick_gelu with gated_linear_unit).
ACTIVATIONS = ("swiglu", "gelu", "relu", "squared_relu", "quick_geglu")
GATED_ACTIVATIONS = ("swiglu", "quick_geglu")


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelSpec:
    name: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    ffn_hidden_size: int | None = None  # dense MLP width; None -> 4 * hidden_size
    num_query_groups: int | None = None  # GQA groups; None -> num_attention_heads (MHA)
    kv_channels: int | None = None  # head dim; None -> hidden_size // num_attention_heads
    vocab_size: int = 32000
    make_vocab_size_divisible_by: int = 128
    max_position_embeddings: int = 4096
    normalization: str = "RMSNorm"
    activation: str = "swiglu"  # swiglu and quick_geglu imply gated_linear_unit
    # --activation-func-clamp-value: a gated unit's two halves clamped before the
    # activation (GPT-OSS: 7.0; megatron-core mlp.py / moe/experts.py). The clamps run as
    # their own kernels (compute/ops.py gated_activation); None: no clamp.
    activation_func_clamp_value: float | None = None
    add_bias_linear: bool = False
    add_qkv_bias: bool = False
    qk_layernorm: bool = False
    position_embedding_type: str = "rope"
    # --rotary-percent: RoPE rotates this fraction of each head's dims (megatron-core
    # RotaryEmbedding: dim = int(kv_channels * rotary_percent)); the rest pass through.
    rotary_percent: float = 1.0
    untie_embeddings_and_output_weights: bool = True
    hidden_dropout: float = 0.0
    attention_dropout: float = 0.0
    # Sliding-window attention: window in tokens for the layers that use it, and how
    # often a layer is a full-attention layer (GPT-OSS alternates: every 2nd is full).
    window_size: int | None = None
    window_full_attention_every: int = 1
    # Mixture of experts.
    num_moe_experts: int | None = None
    moe_router_topk: int = 2
    moe_ffn_hidden_size: int | None = None
    moe_shared_expert_intermediate_size: int | None = None
    moe_layer_freq: int = 1  # every k-th layer is MoE (after the dense-first layers)
    moe_first_k_dense: int = 0  # the first k layers are dense (DeepSeek-V3: 3)
    # Group-limited (node-limited) routing (DeepSeek-V3 Sec. 2.1.2; megatron-core
    # moe_router_num_groups / moe_router_group_topk): experts form num_groups groups and a
    # token's top-k experts come from its group_topk best groups (DeepSeek-V3: 8 and 4).
    moe_router_num_groups: int | None = None
    moe_router_group_topk: int | None = None
    # Token dropping (megatron-core moe_expert_capacity_factor / moe_pad_expert_input_to_
    # capacity): each expert takes at most ceil(T k / E * factor) of a rank's T tokens
    # (moe_utils.get_capacity); with padding it takes exactly that many. None: dropless.
    moe_expert_capacity_factor: float | None = None
    moe_pad_expert_input_to_capacity: bool = False
    # Multi-latent attention (DeepSeek-V2/V3).
    multi_latent_attention: bool = False
    q_lora_rank: int | None = None
    kv_lora_rank: int = 512
    qk_head_dim: int = 128
    qk_pos_emb_head_dim: int = 64
    v_head_dim: int = 128
    # Multi-token prediction layers (DeepSeek-V3: 1).
    mtp_num_layers: int = 0

    def __post_init__(self) -> None:
        check_types(self, _OWNER)
        for f in ("num_layers", "hidden_size", "num_attention_heads", "vocab_size",
                  "make_vocab_size_divisible_by", "max_position_embeddings",
                  "window_full_attention_every", "moe_layer_freq"):
            positive(_OWNER, f, getattr(self, f))
        for f in ("ffn_hidden_size", "num_query_groups", "kv_channels", "num_moe_experts",
                  "moe_ffn_hidden_size", "moe_shared_expert_intermediate_size",
                  "q_lora_rank", "window_size", "moe_router_num_groups",
                  "moe_router_group_topk"):
            v = getattr(self, f)
            if v is not None:
                positive(_OWNER, f, v)
        for f in ("moe_first_k_dense", "mtp_num_layers"):
            non_negative(_OWNER, f, getattr(self, f))
        for f in ("hidden_dropout", "attention_dropout"):
            v = getattr(self, f)
            non_negative(_OWNER, f, v)
            if v >= 1:
                raise ValueError(f"model.{f}={v} must be below 1")
        clamp = self.activation_func_clamp_value
        if clamp is not None and not clamp > 0:
            raise ValueError(f"model.activation_func_clamp_value={clamp} must be positive "
                             "(or null for no clamp)")
        if not 0 < self.rotary_percent <= 1:
            raise ValueError(f"model.rotary_percent={self.rotary_percent} must be in (0, 1]")
        one_of(_OWNER, "normalization", self.normalization, NORMALIZATIONS)
        one_of(_OWNER, "activation", self.activation, ACTIVATIONS)
        one_of(_OWNER, "position_embedding_type", self.position_embedding_type,
               POSITION_EMBEDDINGS)
        divides(_OWNER, "num_attention_heads", self.num_attention_heads,
                "num_query_groups", self.num_groups)
        if self.kv_channels is None and not self.multi_latent_attention:
            divides(_OWNER, "hidden_size", self.hidden_size,
                    "num_attention_heads", self.num_attention_heads)
        if self.is_moe:
            positive(_OWNER, "moe_router_topk", self.moe_router_topk)
            if self.moe_router_topk > self.num_moe_experts:
                raise ValueError(
                    f"model.moe_router_topk={self.moe_router_topk} exceeds "
                    f"num_moe_experts={self.num_moe_experts}")
            g, gk = self.moe_router_num_groups, self.moe_router_group_topk
            if (g is None) != (gk is None):
                raise ValueError(f"model.moe_router_num_groups={g} and moe_router_group_topk="
                                 f"{gk} must be set together")
            if g is not None:
                divides(_OWNER, "num_moe_experts", self.num_moe_experts,
                        "moe_router_num_groups", g)
                if gk > g:
                    raise ValueError(f"model.moe_router_group_topk={gk} exceeds "
                                     f"moe_router_num_groups={g}")
                if self.moe_router_topk > gk * (self.num_moe_experts // g):
                    raise ValueError(
                        f"model.moe_router_topk={self.moe_router_topk} exceeds the "
                        f"{gk * (self.num_moe_experts // g)} experts of moe_router_group_topk="
                        f"{gk} groups")
            cf = self.moe_expert_capacity_factor
            if cf is not None and not cf > 0:
                raise ValueError(f"model.moe_expert_capacity_factor={cf} must be positive "
                                 "(or null for dropless routing)")
            if self.moe_pad_expert_input_to_capacity and cf is None:
                raise ValueError("model.moe_pad_expert_input_to_capacity=True requires "
                                 "moe_expert_capacity_factor (megatron-core rule)")
            if self.moe_first_k_dense >= self.num_layers:
                raise ValueError(
                    f"model.moe_first_k_dense={self.moe_first_k_dense} must be below "
                    f"num_layers={self.num_layers}")

    # ---- derived sizes -------------------------------------------------------------
    @property
    def is_moe(self) -> bool:
        return bool(self.num_moe_experts)

    @property
    def gated(self) -> bool:
        return self.activation in GATED_ACTIVATIONS

    @property
    def num_groups(self) -> int:
        return self.num_query_groups or self.num_attention_heads

    @property
    def head_dim(self) -> int:
        return self.kv_channels or self.hidden_size // self.num_attention_heads

    @property
    def dense_ffn_size(self) -> int:
        return self.ffn_hidden_size or 4 * self.hidden_size

    @property
    def expert_ffn_size(self) -> int:
        return self.moe_ffn_hidden_size or self.dense_ffn_size

    @property
    def padded_vocab_size(self) -> int:
        """Vocab padded as Megatron pads it (without the TP factor; see padded_vocab)."""
        return padded_vocab(self.vocab_size, self.make_vocab_size_divisible_by, 1)

    def is_moe_layer(self, layer: int) -> bool:
        """Whether decoder layer ``layer`` (0-based) has an MoE MLP."""
        if not self.is_moe or layer < self.moe_first_k_dense:
            return False
        return (layer - self.moe_first_k_dense) % self.moe_layer_freq == 0

    @property
    def num_moe_layers(self) -> int:
        return sum(self.is_moe_layer(i) for i in range(self.num_layers))

    def uses_window(self, layer: int) -> bool:
        """Whether decoder layer ``layer`` uses sliding-window attention."""
        if self.window_size is None:
            return False
        return (layer + 1) % self.window_full_attention_every != 0


def padded_vocab(vocab_size: int, divisible_by: int, tp: int) -> int:
    """Megatron-LM's _vocab_size_with_padding: pad to a multiple of divisible_by * tp."""
    multiple = divisible_by * tp
    return -(-vocab_size // multiple) * multiple
