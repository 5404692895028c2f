"""torchtitan's op-level selective activation checkpointing: the bytes a layer keeps.

torchtitan (``activation_checkpoint.mode = "selective"``, ``selective_ac_option =
"op"``, its default) wraps every transformer block in ``checkpoint_wrapper`` with a
selective-checkpoint policy (pytorch/torchtitan@9dec370, torchtitan/parallelisms/
parallelize_llama.py ``_apply_ac_to_transformer_block`` / ``_save_list``; the same policy
at b5bcd76 in torchtitan/distributed/activation_checkpoint.py ``SelectiveAC``):

- the block's input is saved (the checkpoint's argument);
- outputs of the ops in the save list are kept: ``aten.mm`` except every second one
  (the block counts its mms and recomputes the even ones), the flash / efficient SDPA
  (its output and log-sum-exp), ``reduce_scatter``, ``abs`` / ``max``;
- everything else is recomputed in the backward, one block at a time.

A Llama block runs its mms in the order wq, wk, wv, wo, w1, w3, w2 (attention, then
``w2(silu(w1(x)) * w3(x))``), so wq, wv, w1 and w2 outputs are kept and wk, wo, w3 are
recomputed. Under tensor parallelism each rank keeps its shard of the column-parallel
outputs and the full pre-reduce output of the row-parallel w2.

Modelled for dense, non-MLA layers (torchtitan's Llama 3); other layers keep the
megatron-core selective items.
"""
from __future__ import annotations

from primus_ext.memory.act_layer import Dims, Items
from primus_ext.spec.model import ModelSpec

OP_SAC = "op"  # the recompute_modules entry that selects this policy


def op_sac_items(model: ModelSpec, d: Dims, moe: bool) -> Items | None:
    """Saved bytes of one block under op-level SAC, or None where not modelled."""
    if moe or model.multi_latent_attention:
        return None
    h, hd, e, n = model.hidden_size, model.head_dim, d.e, d.n
    a, g = model.num_attention_heads // d.tp, model.num_groups // d.tp
    ffn = model.dense_ffn_size // d.tp
    it: Items = {"sac.block_input": d.n_sp * h * e,
                 "sac.wq_output": n * a * hd * e,
                 "sac.wv_output": n * g * hd * e,
                 "sac.sdpa_output": n * a * hd * e,
                 "softmax_lse": d.b * a * d.s * 4,
                 "sac.w2_output": n * h * e}
    # The up-projection is the 5th mm (kept). Gated: w3 is the 6th (recomputed) and w2
    # the 7th (kept); a plain FFN's down-projection is the 6th (recomputed).
    it["sac.w1_output"] = n * ffn * e
    if not model.gated:
        del it["sac.w2_output"]
    return it
