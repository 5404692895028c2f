"""Ops outside the decoder layers: embedding, final norm + output layer + loss, MTP glue.

- Embedding (first stage): megatron-core's VocabParallelEmbedding looks up rows of the
  local vocab shard (a gather) and, under TP, sums the partial outputs over TP (the
  collective is in comm/layer_comm.py). Its backward materialises the dense gradient of
  the local shard (``V/tp x h``) and adds it into the fp32 main_grad, every microbatch.
- Output (last stage): final norm, the logits GEMM ``[tokens, h] @ [h, V/tp]`` in BF16
  (Megatron keeps the output layer out of FP8), and the vocab-parallel cross-entropy in
  fp32 without fusion (megatron-core's default): forward casts the logits (read 2 B,
  write 4 B), takes the max (4), subtracts (8), exponentiates (8), sums (4) and
  normalises (8): 38 B per logit in 6 kernels; backward reads the softmax and writes the
  gradient (8), scales it (8) and casts it back to BF16 (6): 22 B per logit in 3 kernels.
  With ``train.cross_entropy_loss_fusion`` (megatron-core's fused vocab-parallel kernel,
  TE's parallel_cross_entropy) the forward reads the BF16 logits twice (max, then
  sum-exp with the target logit) and writes the BF16 gradient in place: 6 B per logit in
  2 kernels; the backward scales that gradient: 4 B per logit in 1 kernel.
  With ``train.loss_impl='torch'`` (``torch.nn.functional.cross_entropy`` on the logits in
  their own dtype ``e``, NeMo AutoModel's ``MaskedCrossEntropy(fp32_upcast=False)``):
  log_softmax (aten/src/ATen/native/cuda/SoftMax.cu ``cunn_SoftMaxForward``: a max pass,
  a sum-exp pass and a pass that writes the output; the reductions run in fp32 in
  registers) and nll_loss: 4 passes of ``e`` bytes per logit in 2 kernels; backward,
  nll_loss_backward fills a zero gradient and scatters the targets' entries, and
  ``cunn_SoftMaxBackward`` sums that gradient per row, then reads it with the saved
  output and writes the input gradient: 5 passes in 3 kernels.
- MTP (DeepSeek-V3 Sec. 2.2; megatron-core MultiTokenPredictionLayer): per MTP layer an
  embedding lookup of the shifted tokens, enorm and hnorm, the ``2h -> h`` eh_proj, then a
  transformer layer and the output layer with its loss (added by the backend).
"""
from __future__ import annotations

from primus_ext.compute.ops import OpCost, Shapes, linear, memory_op, norm
from primus_ext.spec.model import padded_vocab

CE_FWD_BYTES_PER_LOGIT = 38.0
CE_BWD_BYTES_PER_LOGIT = 22.0
FUSED_CE_FWD_BYTES_PER_LOGIT = 6.0
FUSED_CE_BWD_BYTES_PER_LOGIT = 4.0
# torch F.cross_entropy without an fp32 upcast: passes over the logits (module docstring).
TORCH_CE_FWD_PASSES = 4
TORCH_CE_BWD_PASSES = 5


def vocab_shard(sh: Shapes) -> int:
    m = sh.model
    return padded_vocab(m.vocab_size, m.make_vocab_size_divisible_by, sh.tp) // sh.tp


def embedding_ops(sh: Shapes) -> list[OpCost]:
    m = sh.model
    h, t, ab = sh.hidden, sh.tokens, sh.act_bytes
    v = vocab_shard(sh)
    # Lookup writes the full [tokens, h] output (zeros outside the shard) and reads the
    # rows it owns (1/tp of them on average).
    look_f = t * h * ab * (1.0 + 1.0 / sh.tp) + t * 8
    # Backward: zero the dense shard gradient, scatter-add dy into it, then accumulate it
    # into the fp32 main_grad (read 2 + 4, write 4).
    grad_b = v * h * ab + t * h * ab * 2 + v * h * (ab + 8)
    ops = [memory_op(sh, "embedding_lookup", "embedding", look_f, grad_b, fwd_kernels=2,
                     bwd_kernels=3, gather=True, bwd_is_wgrad=True)]
    if m.position_embedding_type == "learned_absolute":
        e = t * h * ab
        ops.append(memory_op(sh, "position_embedding", "embedding", 3 * e, 3 * e))
    if m.hidden_dropout > 0:
        e = sh.sp_tokens * h * ab
        ops.append(memory_op(sh, "embedding_dropout", "embedding", 2 * e + e / ab,
                             2 * e + e / ab))
    return ops


def output_ops(sh: Shapes) -> list[OpCost]:
    h, t = sh.hidden, sh.tokens
    v = vocab_shard(sh)
    logits = t * v
    dtype = "fp32" if sh.gemm_dtype == "fp32" else "bf16"
    if sh.train.loss_impl == "torch":
        e = sh.act_bytes
        ce = memory_op(sh, "cross_entropy", "output", TORCH_CE_FWD_PASSES * e * logits,
                       TORCH_CE_BWD_PASSES * e * logits, fwd_kernels=2, bwd_kernels=3)
    elif sh.train.cross_entropy_loss_fusion:
        ce = memory_op(sh, "cross_entropy", "output", FUSED_CE_FWD_BYTES_PER_LOGIT * logits,
                       FUSED_CE_BWD_BYTES_PER_LOGIT * logits, fwd_kernels=2, bwd_kernels=1)
    else:
        ce = memory_op(sh, "cross_entropy", "output", CE_FWD_BYTES_PER_LOGIT * logits,
                       CE_BWD_BYTES_PER_LOGIT * logits, fwd_kernels=6, bwd_kernels=3)
    return [norm(sh, "final_layernorm", sh.sp_tokens, h),
            linear(sh, "output_layer", "output", t, h, v, dtype=dtype), ce]


def mtp_glue_ops(sh: Shapes) -> list[OpCost]:
    """One MTP layer's own ops (its transformer layer and output head come separately)."""
    h = sh.hidden
    return (embedding_ops(sh)
            + [norm(sh, "mtp_enorm", sh.sp_tokens, h), norm(sh, "mtp_hnorm", sh.sp_tokens, h),
               linear(sh, "mtp_eh_proj", "mtp", sh.tokens, 2 * h, h // sh.tp)])
