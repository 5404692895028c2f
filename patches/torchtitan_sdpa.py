"""FlexAttention -> SDPA in torchtitan's language-model configs, on the CPU.

What it fixes (torchtitan 0.3.x, torch 2.13 CPU build): every llama3 / qwen3 flavour is
built with ``attn_backend="flex"`` (``models/llama3/__init__.py: model_registry``), and
FlexAttention has no CPU backward. ``get_attention_config`` (models/common/config_utils.py)
rejects ``"sdpa"`` for language models because SDPA cannot take per-document masks; with
SDPA the Trainer builds no masks (``Trainer.post_dataloading_process``) and attention is
plain causal over the whole sequence -- the same FLOPs and shapes per layer, documents
not separated (no effect on timing or memory). ``"flex"`` maps to
``ScaledDotProductAttention``; other backends are left alone.
"""
from __future__ import annotations

import sys


def apply() -> list[str]:
    from torchtitan.models.common import config_utils
    from torchtitan.models.common.attention import ScaledDotProductAttention
    original = config_utils.get_attention_config
    if getattr(original, "__primus_sdpa__", False):
        return ["torchtitan flex->sdpa"]

    def get_attention_config(backend: str):
        if backend == "flex":
            return ScaledDotProductAttention.Config()
        return original(backend)

    get_attention_config.__primus_sdpa__ = True
    get_attention_config.__wrapped__ = original
    # Rebind where modules imported the name (llama3, qwen3, ... builders).
    for name, mod in list(sys.modules.items()):
        if name.startswith("torchtitan") and mod is not None and \
                mod.__dict__.get("get_attention_config") is original:
            mod.get_attention_config = get_attention_config
    config_utils.get_attention_config = get_attention_config
    return ["torchtitan flex->sdpa"]
