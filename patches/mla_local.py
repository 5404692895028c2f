"""Multi-latent attention with the local (non-TE) core attention.

What it fixes (megatron-core 0.16.x; harmless where the signature already has them):
``MLASelfAttention`` builds its core attention with ``k_channels=q_head_dim`` and
``v_channels=v_head_dim``, but the local ``DotProductAttention.__init__`` does not take
them (``TypeError: DotProductAttention.__init__() got an unexpected keyword argument
'k_channels'``), so an MLA model cannot be built without Transformer Engine. Here the
local attention accepts them: the query/key head dim sets the default softmax scale and
the value head dim sets the context width (``hidden_size_per_partition``), which is all
its forward needs -- the score and context GEMMs take their shapes from the tensors.

Also (0.16.x): without TE, ``megatron.core.extensions.transformer_engine`` still imports
and exports MagicMock placeholders, so ``multi_latent_attention.HAVE_TE`` is True and
``isinstance(self.linear_proj, TELinear)`` raises ``TypeError: isinstance() arg 2 must be
a type``. ``HAVE_TE`` is set False there when ``TELinear`` is not a class.
"""
from __future__ import annotations

import inspect


def apply() -> list[str]:
    try:
        from megatron.core.transformer.dot_product_attention import DotProductAttention
    except ImportError:
        return []
    patched = []
    try:
        from megatron.core.transformer import multi_latent_attention as mla
        if mla.HAVE_TE and not isinstance(mla.TELinear, type):
            mla.HAVE_TE = False
            patched.append("multi_latent_attention.HAVE_TE=False (TE placeholders)")
    except ImportError:
        pass
    init = DotProductAttention.__init__
    if "k_channels" in inspect.signature(init).parameters \
            or getattr(init, "__primus_mla__", False):
        return patched

    def __init__(self, config, layer_number, attn_mask_type, attention_type,
                 attention_dropout=None, softmax_scale=None, cp_comm_type=None,
                 pg_collection=None, k_channels=None, v_channels=None):
        if softmax_scale is None and k_channels is not None:
            softmax_scale = k_channels ** -0.5
        init(self, config, layer_number, attn_mask_type, attention_type,
             attention_dropout=attention_dropout, softmax_scale=softmax_scale,
             cp_comm_type=cp_comm_type, pg_collection=pg_collection)
        if v_channels is not None:
            heads = self.num_attention_heads_per_partition
            self.hidden_size_per_partition = v_channels * heads
            self.hidden_size_per_attention_head = v_channels

    __init__.__primus_mla__ = True
    DotProductAttention.__init__ = __init__
    return patched + ["DotProductAttention(k_channels, v_channels) for MLA"]
