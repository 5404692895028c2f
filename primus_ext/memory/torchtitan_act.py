"""Activation bytes a torchtitan (0.3.0) decoder block saves per microbatch, per rank.

The block is ``torchtitan.models.llama3.model.Llama3TransformerBlock``: ``GQAttention``
with ``FusedQKVLinear`` (``models/llama3/__init__.py`` builds every llama3 with
``fuse_qkv=True``), ``ComplexRoPE``, SDPA, and the SwiGLU ``FeedForward``
(``w2(silu(w1(x)) * w3(x))``); norms are RMSNorm. Tensors are counted as autograd saves
them on a GPU in eager mode:

- RMSNorm (fused ``aten._fused_rms_norm``) keeps its input and an fp32 rstd per token;
- ``wqkv`` keeps its input (the norm output; under sequence parallelism the
  all-gathered full-sequence tensor). Its output is not kept: ``FusedQKVLinear.forward``
  (``models/common/attention.py``, ``_split``) copies Q, K and V out of it
  (``.contiguous()``), and the copies' backward needs nothing saved;
- RoPE (``models/common/rope.py``): ``ComplexRoPE._reshape_cache`` gathers the complex64
  cache by the batch's positions (torchtitan's text datasets always yield
  ``positions``; ``_reshape_for_broadcast``: ``torch.gather`` to ``(batch, seq, 1,
  head_dim/2)``, or an index for a batch of one), a new tensor in every block, which
  the complex product ``x * rope_cache`` saves for its backward (8 B per position and
  frequency; sequence-sharded under CP, replicated over TP). The rotated Q and K
  (``type_as`` of the product) are new tensors SDPA keeps, with the copied V;
- flash SDPA keeps Q, K, V, its output (already ``B, L, N, H`` in memory, so the
  ``.contiguous()`` before ``wo`` is free) and the fp32 log-sum-exp;
- the FFN keeps ``w1``'s output (silu input), silu's output and ``w3``'s output (the
  product's inputs) and the product (``w2``'s input), and the norm output as the input
  of ``w1`` and ``w3``.

``train.compile`` (per-block ``torch.compile``, torchtitan ``apply_compile``): inductor's
min-cut partitioner (``torch/_functorch/partitioners.py``,
``min_cut_rematerialization_partition``) recomputes pointwise chains in the backward
graph instead of saving them: the norm outputs (when not all-gathered: a collective is
never recomputed), the Q/K/V copies and their rotation (from the saved ``wqkv``
output), the RoPE gather (``aten.gather`` / ``aten.index`` are in the partitioner's
``default_recomputable_ops``), silu's output and the product.

``activation_checkpoint``:

- ``full`` (``FullAC``: ``checkpoint_wrapper`` around every block): the block input only;
- ``selective`` (``SelectiveAC``, op-level, ``distributed/activation_checkpoint.py``):
  the block input plus the outputs of the ops in torchtitan's save list
  (``_get_default_save_ops``: compute-intensive aten ops, among them ``mm`` and the SDPA
  kernels, and ``reduce_scatter_tensor`` / ``all_to_all_single``) except every second
  ``mm`` of the block: the mms run wqkv, wo, w1, w3, w2, so wqkv's, w1's and w2's
  outputs are saved and wo and w3 are recomputed. Under TP the saved ``w2`` output is
  the partial sum over the full sequence, and with SP the two reduce-scatter outputs are
  saved too. The SP all-gathers (``all_gather_into_tensor``) and the TP all-reduces are
  not in the save list: the recompute re-issues them (their outputs are transients of
  the recomputed block, counted in its working bytes, not saved).

The embedding under TP (``models/common/embedding.py``, ``Embedding.forward``, vocab
parallel) masks the ids outside the rank's vocabulary shard and multiplies its output by
the mask cast to the compute dtype: the product saves that mask (one element per token)
besides the shifted ids.

MoE and MLA blocks reuse megatron-core's itemisation (``act_layer.py``), a named
approximation: torchtitan's MoE (grouped GEMM, its own token dispatcher) is not
itemised here.
"""
from __future__ import annotations

from primus_ext.memory.act_layer import Dims, Items, mla_items, moe_items
from primus_ext.memory.options import MemoryOptions
from primus_ext.spec.model import ModelSpec
from primus_ext.spec.parallel import ParallelSpec
from primus_ext.spec.train import TrainSpec


def rope_cache_bytes(model: ModelSpec, d: Dims) -> int:
    """The complex64 RoPE cache one block gathers by position: ``(b, s, 1, head_dim/2)``."""
    return d.b * d.s * (model.head_dim // 2) * 8


def _attention(model: ModelSpec, d: Dims, compiled: bool) -> Items:
    h, hd, e = model.hidden_size, model.head_dim, d.e
    a, g = model.num_attention_heads // d.tp, model.num_groups // d.tp
    gathered = d.n_sp != d.n
    it = {"attention_norm.input": d.n_sp * h * e, "attention_norm.rstd": d.n_sp * 4}
    if gathered or not compiled:
        it["wqkv.input"] = d.n * h * e
    if compiled:
        it["wqkv.output"] = d.n * (a + 2 * g) * hd * e
    else:
        it["q.rotated"] = d.n * a * hd * e
        it["k.rotated"] = d.n * g * hd * e
        it["v.copy"] = d.n * g * hd * e
        it["rope.cache"] = rope_cache_bytes(model, d)
    it["sdpa.output"] = d.n * a * hd * e
    it["sdpa.lse"] = d.b * a * d.s * 4
    return it


def _ffn(model: ModelSpec, d: Dims, compiled: bool) -> Items:
    h, e = model.hidden_size, d.e
    f = model.dense_ffn_size // d.tp
    gathered = d.n_sp != d.n
    it = {"ffn_norm.input": d.n_sp * h * e, "ffn_norm.rstd": d.n_sp * 4}
    if gathered or not compiled:
        it["w13.input"] = d.n * h * e
    it["w1.output"] = d.n * f * e
    it["w3.output"] = d.n * f * e
    if not compiled:
        it["silu.output"] = d.n * f * e
        it["w2.input"] = d.n * f * e
    return it


def _selective(model: ModelSpec, d: Dims) -> Items:
    h, hd, e = model.hidden_size, model.head_dim, d.e
    a, g = model.num_attention_heads // d.tp, model.num_groups // d.tp
    f = model.dense_ffn_size // d.tp
    it = {"block.input": d.n_sp * h * e,
          "wqkv.output": d.n * (a + 2 * g) * hd * e,
          "sdpa.output": d.n * a * hd * e,
          "sdpa.lse": d.b * a * d.s * 4,
          "w1.output": d.n * f * e,
          "w2.output": d.n * h * e}
    if d.n_sp != d.n:
        it["wo.reduce_scatter"] = d.n_sp * h * e
        it["w2.reduce_scatter"] = d.n_sp * h * e
    return it


def block_items(model: ModelSpec, par: ParallelSpec, train: TrainSpec, moe: bool,
                options: MemoryOptions, ac: str | None = None) -> Items:
    """Saved bytes of one decoder block under activation checkpointing ``ac``
    (default: the spec's)."""
    ac = train.activation_checkpoint if ac is None else ac
    d = Dims.of(par, train)
    if ac == "full":
        return {"block.input": d.n_sp * model.hidden_size * d.e}
    if ac == "selective" and not moe and not model.multi_latent_attention:
        return _selective(model, d)
    compiled = train.compile
    if model.multi_latent_attention:
        it = mla_items(model, train, d)
    else:
        it = _attention(model, d, compiled)
    if moe:
        it |= moe_items(model, par, d, options)
    else:
        it |= _ffn(model, d, compiled)
    return it


def output_items(model: ModelSpec, par: ParallelSpec, train: TrainSpec) -> Items:
    """Last stage, kept until the decoder's backward: the final norm's input and rstd.
    torchtitan's ChunkedLossWrapper runs lm_head and the loss forward and backward chunk
    by chunk right after the forward, so no logits are kept per microbatch."""
    d = Dims.of(par, train)
    return {"norm.input": d.n_sp * model.hidden_size * d.e, "norm.rstd": d.n_sp * 4}


def loss_working_bytes(model: ModelSpec, par: ParallelSpec, train: TrainSpec,
                       num_chunks: int = 8) -> int:
    """Transient of the chunked loss (components/loss.py ChunkedLossWrapper, 8 chunks):
    the detached hidden states and their accumulated gradient (full local sequence,
    replicated over TP), and one chunk's logits (compute dtype) with the fp32 upcast
    and its gradient, vocab sharded over TP (loss parallel)."""
    d = Dims.of(par, train)
    hidden = 2 * d.n * model.hidden_size * d.e
    rows = -(-d.n // num_chunks)
    return hidden + rows * (-(-model.vocab_size // par.tp)) * (d.e + 4 + 4)


def embedding_items(par: ParallelSpec, train: TrainSpec) -> Items:
    """The token ids the embedding's backward needs (int64) and, under TP, the vocab
    mask in the compute dtype that the masked output's product saves."""
    d = Dims.of(par, train)
    it = {"tok_embeddings.ids": d.n * 8}
    if par.tp > 1:
        it["tok_embeddings.tp_mask"] = d.n * d.e
    return it
