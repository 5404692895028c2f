"""The s x s tensors an unfused (non-flash) attention layer saves for backward.

Two implementations, one per layer stack, with the same shape of computation
(``baddbmm`` scores, scale-mask-softmax, dropout, ``bmm`` with V):

- megatron-core's local ``DotProductAttention`` (megatron/core/transformer/
  dot_product_attention.py), the only core attention of the local spec
  (``get_gpt_layer_local_spec``; ``attention_backend`` only chooses among TE's
  backends). Its softmax is megatron-core's ``FusedScaleMaskSoftmax``
  (megatron/core/fusions/fused_softmax.py);
- Transformer Engine's ``UnfusedDotProductAttention`` (transformer_engine/pytorch/
  attention/dot_product_attention/backends.py), what ``--attention-backend unfused``
  selects on the TE spec. Its softmax is TE's ``FusedScaleMaskSoftmax``
  (attention/dot_product_attention/softmax.py).

Either softmax runs one CUDA kernel when it can (``is_kernel_available``): half-precision
scores, key length in range (megatron-core: 16 < sk <= 4096; TE: 16 < sk < 16384 and
sk % 8 == 0) and batch x heads a multiple of the kernel's rows per block. The kernel
(``ScaledUpperTriangMaskedSoftmax`` / TE's ``scaled_*_softmax_fwd``) saves only its
output, in the input dtype, and builds the causal mask itself. Otherwise the torch path
runs: the scores upcast to fp32 (``attention_softmax_in_fp32``; TE always), softmax
saves its fp32 output, and the cast back to the compute dtype is the next op's input;
megatron-core rebuilds and saves a bool causal mask per layer (mcore 0.16
``get_default_causal_mask``), TE masks with one cached mask (``_get_default_causal_mask``).
The kernels are CUDA only: ``train.masked_softmax_fusion`` None resolves to off on the
``cpu`` preset (memory/report.py), which is what the CPU ground truth runs.

Dropout (``attention_dropout`` > 0) saves its bool mask, and ``bmm`` saves its input
(the dropout output); without dropout ``bmm`` saves the softmax output itself.
"""
from __future__ import annotations

from primus_ext.memory.dims import Dims, Items
from primus_ext.spec.model import ModelSpec
from primus_ext.spec.parallel import ParallelSpec
from primus_ext.spec.train import TrainSpec

_ROWS_PER_BLOCK = 4  # 128 threads / one warp of 32 per row, one row per warp (sk >= 128)


def softmax_kernel(d: Dims, heads: int) -> bool:
    """Whether the fused scale-mask-softmax kernel runs for these scores (module
    docstring): causal self-attention, sq == sk."""
    if not d.fused_softmax or d.e != 2:
        return False
    sk = d.s
    if d.te:
        in_range = 16 < sk < 16384 and sk % 8 == 0
    else:
        in_range = 16 < sk <= 4096 and sk % 4 == 0
    rows = d.b * heads
    return in_range and sk % 4 == 0 and rows % 4 == 0 and (
        (d.te and sk % _ROWS_PER_BLOCK == 0) or (not d.te and rows % _ROWS_PER_BLOCK == 0))


def score_items(model: ModelSpec, train: TrainSpec, d: Dims, heads: int) -> Items:
    """The s x s tensors one layer saves (module docstring), ``heads`` on this rank."""
    scores = d.b * heads * d.s * d.s
    it: Items = {}
    if softmax_kernel(d, heads):
        it["softmax.output"] = scores * d.e
    else:
        soft = 4 if (d.te or train.attention_softmax_in_fp32) else d.e
        it["softmax.output"] = scores * soft
        if soft != d.e and not model.attention_dropout > 0:
            it["softmax.cast"] = scores * d.e  # the probabilities cast back for bmm
        if not d.te:
            it["causal_mask"] = d.s * d.s  # bool, rebuilt per layer (mcore 0.16)
    if model.attention_dropout > 0:
        it["attn_dropout.mask"] = scores
        it["attn_dropout.output"] = scores * d.e  # bmm input
    return it


def unfused_scores_bytes(model: ModelSpec, par: ParallelSpec, train: TrainSpec) -> int:
    """The raw attention scores of one layer (``baddbmm``'s output, the softmax input):
    alive inside the attention's forward beside the saved probabilities, not saved
    (the softmax saves its output). 0 for fused attention."""
    d = Dims.of(par, train)
    if d.flash:
        return 0
    heads = model.num_attention_heads // par.tp
    return d.b * heads * d.s * d.s * d.e
