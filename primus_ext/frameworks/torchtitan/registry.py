"""torchtitan 0.3.0's config registry as the projection knows it (pure data, no torch).

``--module M --config F`` (``torchtitan.config.manager.ConfigManager``) calls the
function ``F`` of ``torchtitan/models/M/config_registry.py``; it returns a
``Trainer.Config`` whose model comes from ``M``'s ``model_registry(flavor)``
(``torchtitan/models/M/__init__.py``) and whose training / parallelism / activation-
checkpoint values a line inherits unless it overrides them. Each ``Registry`` row holds
the project's model preset with the same shape (``model`` plus ``model_overrides``) and
those inherited values. ``registry_read.py`` reads both from torchtitan itself, and
``tests/torchtitan/test_titan_registry.py`` holds every row equal to it.

Families of 0.3.0's registry (``torchtitan/models/__init__.py _supported_models``):
llama3, qwen3 (dense and MoE), deepseek_v3 (MLA + MoE) and gpt_oss (MoE, sliding
windows, attention sinks) are decoders the projection models; the rest are refused with
their reason (``NOT_MODELLED``). Config functions that only change kernels the projection
does not model (float8 / mxfp8 / nvfp4 converters needing torchao, DeepEP / HybridEP /
async-EP dispatch backends, varlen-attention SFT) are left out and refused by name.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Registry:
    """One config function: its model (a preset and overrides of its fields) and the
    values a line inherits when it does not override them."""
    module: str
    config: str
    model: str
    local_batch_size: int
    seq_len: int
    activation_checkpoint: str
    tp: int = 1
    compile: bool = False  # torch.compile of the model (compile.components has "model")
    async_tp: bool = False
    float8: bool = False
    schedule: str = "1F1B"
    pp: int = 1
    ep: int = 1
    cuda_graphs: bool = True  # training.disable_cuda_graphs False
    model_overrides: tuple[tuple[str, object], ...] = ()

    def model_fields(self) -> dict:
        """The ModelSpec fields of this config function's model."""
        from primus_ext.presets import model_preset
        return {**model_preset(self.model), **dict(self.model_overrides)}

    def hydra_overrides(self) -> list[str]:
        return [f"model={self.model}"] + [f"model.{k}={'null' if v is None else v}"
                                          for k, v in self.model_overrides]


R = Registry
REGISTRY = (
    # torchtitan/models/llama3/config_registry.py
    R("llama3", "llama3_debugmodel", "llama3_debugmodel", 8, 2048, "selective",
      schedule="Interleaved1F1B"),
    R("llama3", "llama3_8b", "llama3.1_8b", 1, 8192, "selective"),
    R("llama3", "llama3_70b", "llama3.1_70b", 8, 8192, "full", tp=8),
    R("llama3", "llama3_405b", "llama3.1_405b", 2, 8192, "full", tp=8, compile=True,
      async_tp=True, float8=True),
    # torchtitan/models/qwen3/config_registry.py (flavours of qwen3/__init__.py)
    R("qwen3", "qwen3_debugmodel", "qwen3_debugmodel", 8, 2048, "selective"),
    R("qwen3", "qwen3_0_6b", "qwen3_0.6b", 4, 4096, "selective"),
    R("qwen3", "qwen3_1_7b", "qwen3_1.7b", 4, 4096, "selective"),
    R("qwen3", "qwen3_14b", "qwen3_14b", 4, 4096, "full"),
    R("qwen3", "qwen3_32b", "qwen3_32b", 2, 4096, "full"),
    R("qwen3", "qwen3_moe_debug", "qwen3_moe_debugmodel", 4, 4096, "selective"),
    R("qwen3", "qwen3_30b_a3b", "qwen3_30b_a3b", 2, 4096, "full"),
    # torchtitan/models/deepseek_v3/config_registry.py: the 16B flavour is
    # DeepSeek-V2-Lite's shape; 671B is DeepSeek-V3 without MTP (num_mtp_layers=0).
    # Both compile the loss only (CompileConfig components=["loss"]).
    R("deepseek_v3", "deepseek_v3_debugmodel", "deepseek_v3_debugmodel", 8, 2048,
      "selective"),
    R("deepseek_v3", "deepseek_v3_16b", "deepseek_v2_lite", 4, 4096, "selective",
      schedule="Interleaved1F1B", ep=8, cuda_graphs=False),
    R("deepseek_v3", "deepseek_v3_671b", "deepseek_v3", 4, 4096, "selective",
      schedule="Interleaved1F1B", ep=2, cuda_graphs=False,
      model_overrides=(("mtp_num_layers", 0),)),
    # torchtitan/models/gpt_oss/config_registry.py
    R("gpt_oss", "gpt_oss_20b", "gpt_oss_20b", 1, 8192, "full"),
    R("gpt_oss", "gpt_oss_120b", "gpt_oss_120b", 1, 8192, "full"),
)
del R

# Families of torchtitan 0.3.0's registry the projection does not model, and why.
NOT_MODELLED = {
    "flux": "a diffusion transformer (image latents, T5 / CLIP encoders), not a decoder "
            "language model",
    "qwen3_5": "Qwen3.5's hybrid of gated-delta-net linear attention and full attention "
               "layers with a vision encoder; the projector covers softmax-attention "
               "decoders",
    "kimi_k2_7": "a vision-language model (MoonViT encoder beside the decoder)",
    "muse_glimmer": "a vision-language model (a vision encoder beside the decoder)",
}

# The model fields that make two models the same for torchtitan's line.
SHAPE_FIELDS = ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads",
                "num_groups", "head_dim", "vocab_size", "untie_embeddings_and_output_"
                "weights", "qk_layernorm", "num_moe_experts", "moe_router_topk",
                "moe_ffn_hidden_size", "moe_shared_expert_intermediate_size",
                "moe_first_k_dense", "multi_latent_attention", "q_lora_rank",
                "kv_lora_rank", "mtp_num_layers", "window_size")


def lookup(module: str | None, config: str | None) -> Registry:
    """The row of ``--module module --config config``; ValueError naming what is known."""
    if module is None or config is None:
        raise ValueError("--module and --config are required (torchtitan ConfigManager: "
                         "'--module llama3 --config llama3_8b')")
    if module in NOT_MODELLED:
        raise ValueError(f"--module {module}: torchtitan ships it, but it is "
                         f"{NOT_MODELLED[module]}; the projector covers the decoder "
                         f"families {', '.join(sorted({r.module for r in REGISTRY}))}")
    for r in REGISTRY:
        if r.module == module and r.config == config:
            return r
    known = ", ".join(r.config for r in REGISTRY if r.module == module) or ", ".join(
        f"{r.module}/{r.config}" for r in REGISTRY)
    raise ValueError(f"--module {module} --config {config}: not a config function the "
                     f"projection knows ({known})")


def _shape(model) -> tuple:
    q_lora = model.q_lora_rank if model.multi_latent_attention else None
    kv_lora = model.kv_lora_rank if model.multi_latent_attention else None
    moe = ("num_moe_experts", "moe_router_topk", "moe_ffn_hidden_size",
           "moe_shared_expert_intermediate_size", "moe_first_k_dense")
    ffn_used = not model.is_moe or model.moe_first_k_dense > 0
    out = []
    for f in SHAPE_FIELDS:
        v = getattr(model, f)
        if f == "q_lora_rank":
            v = q_lora
        elif f == "kv_lora_rank":
            v = kv_lora
        elif f in moe and not model.is_moe:
            v = None
        elif f == "ffn_hidden_size" and not ffn_used:
            v = None
        elif f == "head_dim" and model.multi_latent_attention:
            v = None
        out.append(v)
    return tuple(out)


def registry_for(model) -> Registry:
    """The config function whose model has ``model``'s shape (not its name)."""
    from primus_ext.spec.model import ModelSpec
    want = _shape(model)
    for r in REGISTRY:
        if _shape(ModelSpec(**r.model_fields())) == want:
            return r
    raise ValueError(
        f"model={model.name}: no torchtitan config function (0.3.0 registry) has this "
        f"shape ({', '.join(r.config for r in REGISTRY)}); torchtitan's line needs one "
        "(--module/--config)")
