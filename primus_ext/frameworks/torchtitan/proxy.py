"""What the torchtitan measurement builds for a model it has no own measured decoder for
(pure: no torch).

The measured run is a llama3-style decoder (``build.llama3_model_config``: RMSNorm,
SwiGLU, RoPE, no biases) with each rank's hidden size, heads, head dim, query groups,
q/k norms, FFN and vocabulary. ``PARTS`` lists what a ``ModelSpec`` can have beyond that,
each with the overrides that turn it into what is built: ``llama3_gaps`` says what is
left out, ``proxy_spec`` is the spec the measurement plan sizes.
"""
from __future__ import annotations

from primus_ext.presets.overrides import apply_overrides
from primus_ext.spec import ModelSpec, RunSpec


def _moe(m: ModelSpec):
    return (f"MoE layers ({m.num_moe_experts} experts, top-{m.moe_router_topk}; measured "
            "as dense SwiGLU FFNs)",
            ["model.num_moe_experts=null", "model.moe_first_k_dense=0",
             "model.moe_shared_expert_intermediate_size=null",
             f"model.ffn_hidden_size={m.dense_ffn_size}"])


# (present?, (description, overrides) of what the llama3-style decoder builds instead)
PARTS = (
    (lambda m: m.is_moe, _moe),
    (lambda m: m.multi_latent_attention,
     lambda m: ("multi-latent attention", ["model.multi_latent_attention=false"])),
    (lambda m: m.window_size is not None,
     lambda m: (f"sliding-window attention (window {m.window_size})",
                ["model.window_size=null"])),
    (lambda m: m.activation != "swiglu",
     lambda m: (f"activation {m.activation} (SwiGLU measured)", ["model.activation=swiglu"])),
    (lambda m: m.normalization != "RMSNorm",
     lambda m: (f"{m.normalization} (RMSNorm measured)", ["model.normalization=RMSNorm"])),
    (lambda m: m.add_bias_linear or m.add_qkv_bias,
     lambda m: ("linear biases", ["model.add_bias_linear=false", "model.add_qkv_bias=false"])),
    (lambda m: bool(m.mtp_num_layers),
     lambda m: ("MTP layers", ["model.mtp_num_layers=0"])),
)


def _present(m: ModelSpec) -> list[tuple[str, list[str]]]:
    return [part(m) for has, part in PARTS if has(m)]


def llama3_gaps(model: ModelSpec) -> list[str]:
    """What ``model`` has that the measured llama3-style decoder does not build."""
    return [what for what, _ in _present(model)]


def proxy_spec(spec: RunSpec) -> RunSpec:
    """``spec`` as the measured run builds it: a llama3-style dense decoder with the same
    per-rank dims."""
    ov = [o for _, overrides in _present(spec.model) for o in overrides]
    return apply_overrides(spec, ov) if ov else spec
