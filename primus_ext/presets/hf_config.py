"""A model read from a Hugging Face ``config.json``: one more way to build a ModelSpec.

``model_from_hf(path)`` takes a ``config.json`` (or a directory holding one) and returns
the ModelSpec fields it implies, with a note for every key of the file the projection
does not model (nothing is dropped silently). The mapping follows each family's
``transformers`` modelling code (``models/<family>/modeling_<family>.py``):

- llama, mistral, qwen2, qwen3, gemma2, gemma3: dense decoders; GQA from
  ``num_key_value_heads``; ``head_dim`` where the file gives one (Qwen3, Gemma: the query
  projection may be wider than ``hidden_size``); Qwen2 always has q/k/v biases
  (``Qwen2Attention`` builds them with ``bias=True``); Qwen3 and Gemma3 normalise q and k.
- mixtral, qwen2_moe, qwen3_moe, gpt_oss: every layer MoE (or every ``decoder_sparse_step``
  th), Qwen2-MoE with a shared expert.
- deepseek_v2, deepseek_v3: multi-latent attention, shared experts, the first
  ``first_k_dense_replace`` layers dense, group-limited routing (``n_group``/``topk_group``),
  MTP layers (``num_nextn_predict_layers``).

Sliding windows: ``layer_types`` (gpt-oss, Gemma3, newer files) or the family's fixed
pattern (Gemma2 alternates, Gemma3 has ``sliding_window_pattern``), Mistral and Mixtral
window every layer. Pure: reads JSON, imports neither torch nor Hydra.
"""
from __future__ import annotations

import json
from pathlib import Path

from primus_ext.presets.hf_keys import METADATA, NOT_MODELLED

SUPPORTED = ("llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe",
             "deepseek_v2", "deepseek_v3", "gpt_oss", "gemma2", "gemma3", "gemma3_text")
_DENSE = ("llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3_text")
# transformers' default of tie_word_embeddings per family where the file omits it.
_TIED_BY_DEFAULT = ("gemma2", "gemma3_text")
_GATED_ACTS = {"silu": "swiglu", "swish": "swiglu",
               # Gemma's GeGLU has SwiGLU's GEMM shapes; only the elementwise gate differs.
               "gelu_pytorch_tanh": "swiglu", "gelu": "swiglu"}


def read_hf_config(path: str | Path) -> tuple[dict, str]:
    """The parsed ``config.json`` at ``path`` (a file or a directory holding one) and a
    default model name (the directory's name)."""
    p = Path(path).expanduser()
    if p.is_dir():
        p = p / "config.json"
    if not p.is_file():
        raise ValueError(f"model.hf_config={str(path)!r}: no config.json there (give a "
                         "config.json or a directory holding one)")
    try:
        data = json.loads(p.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"model.hf_config={str(path)!r}: not a readable JSON file "
                         f"({exc})") from None
    if not isinstance(data, dict):
        raise ValueError(f"model.hf_config={str(path)!r}: a config.json holds one JSON "
                         "object")
    return data, p.parent.name or "hf_model"


def model_from_hf(path: str | Path) -> tuple[dict, list[str]]:
    """ModelSpec fields and notes for the ``config.json`` at ``path``."""
    data, name = read_hf_config(path)
    fields, notes = fields_from_hf(data)
    return {"name": name, **fields}, notes


class _Reader:
    """Reads keys of one config and remembers which ones it used."""

    def __init__(self, cfg: dict, where: str):
        self.cfg, self.where, self.used = cfg, where, set()

    def has(self, key: str) -> bool:
        return self.cfg.get(key) is not None

    def get(self, key: str, default=None):
        self.used.add(key)
        v = self.cfg.get(key)
        return default if v is None else v

    def need(self, key: str, kind=int):
        self.used.add(key)
        v = self.cfg.get(key)
        if v is None:
            raise ValueError(f"model.hf_config: {self.where}{key} is missing; a "
                             f"{self.cfg.get('model_type')} config.json states it")
        if kind is int and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise ValueError(f"model.hf_config: {self.where}{key}={v!r} must be a positive "
                             "integer")
        return v


def fields_from_hf(cfg: dict) -> tuple[dict, list[str]]:
    """ModelSpec fields (without ``name``) and notes for one parsed config.json."""
    notes: list[str] = []
    model_type = cfg.get("model_type")
    where = ""
    if model_type == "gemma3" and isinstance(cfg.get("text_config"), dict):
        # The multimodal Gemma3 file nests its decoder; the vision tower is not projected.
        outer = set(cfg) - {"text_config", "model_type"}
        notes.append("gemma3: the text decoder (text_config) is projected; the vision "
                     f"tower and its keys are not ({', '.join(sorted(outer))})")
        cfg = {"model_type": "gemma3_text", **cfg["text_config"]}
        model_type, where = "gemma3_text", "text_config."
    elif model_type == "gemma3":
        model_type = "gemma3_text"  # a flat Gemma3 file: the decoder's keys at the top
    if model_type not in SUPPORTED:
        raise ValueError(f"model.hf_config: model_type={model_type!r} is not supported; "
                         f"supported: {', '.join(SUPPORTED)}")
    r = _Reader({**cfg, "model_type": model_type}, where)
    r.used.add("model_type")
    f: dict = {
        "num_layers": r.need("num_hidden_layers"),
        "hidden_size": r.need("hidden_size"),
        "num_attention_heads": r.need("num_attention_heads"),
        "vocab_size": r.need("vocab_size"),
        "max_position_embeddings": r.need("max_position_embeddings"),
        "normalization": "RMSNorm",
        "position_embedding_type": "rope",
    }
    act = r.get("hidden_activation") or r.get("hidden_act", "silu")
    if act not in _GATED_ACTS:
        raise ValueError(f"model.hf_config: {where}hidden_act={act!r} is not supported; "
                         f"supported: {', '.join(_GATED_ACTS)}")
    f["activation"] = _GATED_ACTS[act]
    if act.startswith("gelu"):
        notes.append(f"hidden_act={act}: the gated GELU MLP is projected with SwiGLU's "
                     "shapes (same GEMMs and parameters; the elementwise gate differs)")
    tie = r.get("tie_word_embeddings", model_type in _TIED_BY_DEFAULT)
    if "tie_word_embeddings" not in cfg:
        notes.append(f"tie_word_embeddings not stated: {model_type}'s default "
                     f"({str(tie).lower()}) taken")
    f["untie_embeddings_and_output_weights"] = not tie
    dropout = r.get("attention_dropout", 0.0)
    if dropout:
        f["attention_dropout"] = float(dropout)
    if model_type.startswith("deepseek"):
        _deepseek(r, f, notes)
    else:
        _attention(r, f, notes, model_type)
        _mlp(r, f, notes, model_type)
    _windows(r, f, notes, model_type)
    notes += _unread(cfg, r.used, model_type, where)
    return f, notes


def _attention(r: _Reader, f: dict, notes: list[str], model_type: str) -> None:
    f["num_query_groups"] = r.get("num_key_value_heads", f["num_attention_heads"])
    if r.has("head_dim"):
        f["kv_channels"] = r.need("head_dim")
    elif f["hidden_size"] % f["num_attention_heads"]:
        raise ValueError("model.hf_config: head_dim is missing and hidden_size is not "
                         "divisible by num_attention_heads")
    f["qk_layernorm"] = model_type in ("qwen3", "qwen3_moe", "gemma3_text")
    if model_type in ("qwen2", "qwen2_moe"):
        f["add_qkv_bias"] = True  # Qwen2Attention: q/k/v with bias, o_proj without
    elif model_type == "gpt_oss":
        # GptOssAttention: q/k/v/o with bias; experts with biases (add_bias_linear).
        f["add_bias_linear"] = bool(r.get("attention_bias", True))
        # GptOssExperts: gate * sigmoid(1.702 gate) * (up + 1), both clamped at
        # swiglu_limit: megatron-core's quick-GeGLU with --activation-func-clamp-value
        # (Megatron-Bridge gpt_oss_bridge.py: quick_gelu, clamp 7.0, glu_linear_offset 1).
        f["activation"] = "quick_geglu"
        limit = r.get("swiglu_limit")
        if limit:
            f["activation_func_clamp_value"] = float(limit)
        notes.append("gpt_oss: learned attention sinks (one per head and layer) and the "
                     "router's bias are not modelled (negligible in parameters and FLOPs)")
    elif r.get("attention_bias", False):
        f["add_qkv_bias"] = True
        notes.append("attention_bias=true: q/k/v biases modelled; the o_proj bias "
                     f"({f['hidden_size']} per layer) is not")
    if model_type.startswith("gemma"):
        notes.append(f"{model_type}: the extra post-attention and post-feedforward "
                     f"RMSNorms ({2 * f['hidden_size']} parameters per layer), the embedding "
                     "scale by sqrt(hidden_size) and logit soft-capping are not modelled")


def _mlp(r: _Reader, f: dict, notes: list[str], model_type: str) -> None:
    if model_type in _DENSE:
        f["ffn_hidden_size"] = r.need("intermediate_size")
        if r.get("mlp_bias", False):
            f["add_bias_linear"] = True
            notes.append("mlp_bias=true: every linear layer is given a bias "
                         "(add_bias_linear), o_proj's included")
        return
    if model_type in ("mixtral", "gpt_oss"):
        f["num_moe_experts"] = r.need("num_local_experts")
        f["moe_ffn_hidden_size"] = f["ffn_hidden_size"] = r.need("intermediate_size")
        topk = r.get("num_experts_per_tok") or r.get("experts_per_token")
        r.used.update({"num_experts_per_tok", "experts_per_token"})
    else:  # qwen2_moe, qwen3_moe
        f["num_moe_experts"] = r.need("num_experts")
        f["moe_ffn_hidden_size"] = r.need("moe_intermediate_size")
        f["ffn_hidden_size"] = r.get("intermediate_size", f["moe_ffn_hidden_size"])
        topk = r.get("num_experts_per_tok")
        step = r.get("decoder_sparse_step", 1)
        if step != 1:
            f["moe_layer_freq"] = step
            notes.append(f"decoder_sparse_step={step}: every {step}th layer is MoE, counted "
                         "from layer 0 as megatron-core places them (transformers counts "
                         f"from layer {step - 1}): the same number of MoE layers")
        only = r.get("mlp_only_layers") or []
        if only:
            raise ValueError(f"model.hf_config: mlp_only_layers={only} (dense layers at "
                             "chosen positions) is not expressible; ModelSpec places dense "
                             "layers first (moe_first_k_dense) or periodically")
        if model_type == "qwen2_moe" and r.get("shared_expert_intermediate_size"):
            f["moe_shared_expert_intermediate_size"] = r.need(
                "shared_expert_intermediate_size")
            notes.append("qwen2_moe: the shared expert's sigmoid gate (hidden_size "
                         "parameters per layer) is not modelled")
    if not isinstance(topk, int) or topk < 1:
        raise ValueError("model.hf_config: num_experts_per_tok is missing or not a positive "
                         "integer")
    f["moe_router_topk"] = topk


def _deepseek(r: _Reader, f: dict, notes: list[str]) -> None:
    """Multi-latent attention and DeepSeekMoE (arXiv:2405.04434 Sec. 2; 2412.19437)."""
    f["multi_latent_attention"] = True
    f["q_lora_rank"] = r.get("q_lora_rank")
    f["kv_lora_rank"] = r.need("kv_lora_rank")
    f["qk_head_dim"] = r.need("qk_nope_head_dim")
    f["qk_pos_emb_head_dim"] = r.need("qk_rope_head_dim")
    f["v_head_dim"] = r.need("v_head_dim")
    r.used.add("num_key_value_heads")  # MLA: every head has its own k and v
    if r.get("attention_bias", False):
        raise ValueError("model.hf_config: attention_bias=true with multi-latent attention "
                         "is not expressible")
    f["ffn_hidden_size"] = r.need("intermediate_size")
    if not r.has("n_routed_experts"):
        notes.append("deepseek: n_routed_experts not stated: a dense model")
        r.used.add("n_routed_experts")
        return
    f["num_moe_experts"] = r.need("n_routed_experts")
    f["moe_router_topk"] = r.need("num_experts_per_tok")
    f["moe_ffn_hidden_size"] = r.need("moe_intermediate_size")
    shared = r.get("n_shared_experts", 0)
    if shared:
        f["moe_shared_expert_intermediate_size"] = shared * f["moe_ffn_hidden_size"]
    f["moe_first_k_dense"] = r.get("first_k_dense_replace", 0)
    f["moe_layer_freq"] = r.get("moe_layer_freq", 1)
    groups, topk_groups = r.get("n_group", 1), r.get("topk_group", 1)
    if groups > 1:
        f["moe_router_num_groups"], f["moe_router_group_topk"] = groups, topk_groups
    f["mtp_num_layers"] = r.get("num_nextn_predict_layers", 0)


def _windows(r: _Reader, f: dict, notes: list[str], model_type: str) -> None:
    n = f["num_layers"]
    window = r.get("sliding_window")
    types = r.get("layer_types")
    if model_type in ("qwen2", "qwen2_moe", "qwen3", "qwen3_moe"):
        r.used.update({"use_sliding_window", "max_window_layers"})
        if not r.get("use_sliding_window", False):
            return  # Qwen: sliding_window is inert unless use_sliding_window
        raise ValueError("model.hf_config: use_sliding_window=true with max_window_layers "
                         "(windows on the top layers only) is not expressible")
    if window is None:
        return
    if types is not None:
        sliding = [t == "sliding_attention" for t in types]
        if len(sliding) != n:
            raise ValueError(f"model.hf_config: layer_types has {len(sliding)} entries for "
                             f"num_hidden_layers={n}")
    elif model_type == "gemma2":
        sliding = [i % 2 == 0 for i in range(n)]  # Gemma2DecoderLayer: even layers local
    elif model_type == "gemma3_text":
        k = r.get("sliding_window_pattern", 6)
        sliding = [(i + 1) % k != 0 for i in range(n)]
    else:
        sliding = [True] * n  # Mistral, Mixtral: every layer
    if not any(sliding):
        return
    # ModelSpec: layer i is full when (i + 1) % every == 0; "never full" is every > n.
    every = next((i + 1 for i, s in enumerate(sliding) if not s), n + 1)
    if sliding != [(i + 1) % every != 0 for i in range(n)]:
        raise ValueError("model.hf_config: layer_types is not periodic (a full-attention "
                         "layer every k layers); ModelSpec cannot express it")
    f["window_size"] = window
    f["window_full_attention_every"] = every


def _unread(cfg: dict, used: set[str], model_type: str, where: str) -> list[str]:
    """One note naming every key of the file the projection does not model."""
    rest = sorted(set(cfg) - used)
    meta = [k for k in rest if k in METADATA]
    known = [k for k in rest if k in NOT_MODELLED]
    unknown = [k for k in rest if k not in METADATA and k not in NOT_MODELLED]
    notes = []
    if known:
        notes.append("not modelled (" + "; ".join(
            f"{where}{k}: {NOT_MODELLED[k]}" for k in known) + ")")
    if unknown:
        notes.append(f"not read (unknown to the {model_type} reader): "
                     + ", ".join(where + k for k in unknown))
    if meta:
        notes.append("metadata, no effect on time or memory: "
                     + ", ".join(where + k for k in meta))
    return notes
