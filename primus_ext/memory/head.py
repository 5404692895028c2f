"""The last stage's output layer and loss: what they save, and the transient peak of the
loss (the largest short-lived allocation of a GPT step: logits are tokens x vocab/tp).

The output layer (megatron-core ``tensor_parallel.ColumnParallelLinear``) saves its input
and writes the logits in the compute dtype; ``GPTModel._postprocess`` keeps them as a
local while ``LanguageModule.compute_language_model_loss`` runs one of three losses
(``n`` tokens, ``v`` = padded vocab / tp, ``e`` bytes per compute-dtype element):

- unfused (``tensor_parallel.vocab_parallel_cross_entropy``, megatron/core/
  tensor_parallel/cross_entropy.py ``_VocabParallelCrossEntropy``):
  ``calculate_logits_max`` makes an fp32 copy (``.float()``), every later op works on it
  in place, and it is saved as the softmax (4nv). In the forward the compute-dtype logits
  are alive beside it; in the backward the fp32 gradient (the saved softmax, written in
  place) is cast back to the logits' dtype (the ``.float()`` node's backward) while it is
  alive. Peak: 4nv saved + nv*e transient.
- fused native (``--cross-entropy-loss-fusion --cross-entropy-fusion-impl native``,
  megatron/core/fusions/fused_cross_entropy.py): the same functions under
  ``jit_fuser`` = ``torch.compile`` (megatron/core/jit.py). ``calculate_predicted_logits``
  and ``calculate_gradients`` mutate their fp32 input in place; AOTAutograd
  functionalizes an input mutation (the compiled graph writes the new values to a fresh
  buffer and copies them back into the input), so a second fp32 tensor exists at their
  end: 4nv saved + nv*e + 4nv transient.
- TE (``--cross-entropy-fusion-impl te``, transformer_engine/pytorch/cross_entropy.py
  ``CrossEntropyFunction``; triton/cross_entropy.py ``cross_entropy_forward``): the
  Triton kernels compute the loss and the input gradient in the forward. Up to TE 2.17
  they write the gradient into the logits in place and save them: nv*e saved, no
  transient. From TE 2.18 (#3193, ``MemoryOptions.te_cross_entropy_fp32_grad``) they
  write it to a new fp32 tensor (``torch.empty_like(_input, dtype=torch.float32)``) and
  save that; the logits are alive beside it in the forward, and its cast back to the
  logits' dtype in the backward: 4nv saved + nv*e transient.
- torch (``train.loss_impl='torch'``: ``torch.nn.functional.cross_entropy`` on the logits
  in their own dtype, NeMo AutoModel's ``MaskedCrossEntropy(fp32_upcast=False)``):
  log_softmax saves its output (nv*e; tests/memory/test_torch_loss.py holds it against
  torch's own saved tensors) and nll_loss the targets and a scalar total weight; the logits are alive beside the
  output in the forward, and in the backward nll_loss's gradient and log_softmax's input
  gradient beside the saved output: nv*e saved + 2nv*e transient.
"""
from __future__ import annotations

from primus_ext.memory.act_layer import norm_items
from primus_ext.memory.dims import Dims, Items
from primus_ext.memory.options import DEFAULT_OPTIONS, MemoryOptions
from primus_ext.spec.model import ModelSpec, padded_vocab
from primus_ext.spec.parallel import ParallelSpec
from primus_ext.spec.train import TrainSpec


def te_cross_entropy(train: TrainSpec) -> bool:
    """The loss is TE's fused cross entropy (``--cross-entropy-loss-fusion
    --cross-entropy-fusion-impl te``; megatron-core LanguageModule.
    compute_language_model_loss calls te_parallel_cross_entropy)."""
    return train.cross_entropy_loss_fusion and train.cross_entropy_fusion_impl == "te"


def _vocab(model: ModelSpec, par: ParallelSpec) -> int:
    return padded_vocab(model.vocab_size, model.make_vocab_size_divisible_by, par.tp) // par.tp


def head_items(model: ModelSpec, par: ParallelSpec, train: TrainSpec,
               final_norm: bool = True, options: MemoryOptions = DEFAULT_OPTIONS) -> Items:
    """Final norm, output layer input and the vocab-parallel cross entropy (saved)."""
    d = Dims.of(par, train)
    v = _vocab(model, par)
    it = norm_items(model, d, "final_norm", d.n_sp, model.hidden_size) if final_norm else {}
    it["output_layer.input"] = d.n_sp * model.hidden_size * d.e
    if train.loss_impl == "torch":
        it["loss.log_softmax"] = d.n * v * d.e
        it["loss.target"] = d.n * 8
        it["loss.total_weight"] = d.e  # nll_loss's scalar, in the logits' dtype
        return it
    if te_cross_entropy(train):
        # CrossEntropyFunction.forward saves the input gradient the kernel wrote: into
        # the logits (TE <= 2.17) or a new fp32 tensor (TE >= 2.18).
        if options.te_cross_entropy_fp32_grad:
            it["loss.grad_input"] = d.n * v * 4
        else:
            it["loss.logits"] = d.n * v * d.e
        return it
    # _VocabParallelCrossEntropy keeps exp(logits - max) in fp32, the target mask and
    # the masked target ids.
    it["loss.exp_logits"] = d.n * v * 4
    it["loss.target_mask"] = d.n
    it["loss.masked_target"] = d.n * 8
    return it


def loss_transient_bytes(model: ModelSpec, par: ParallelSpec, train: TrainSpec,
                         options: MemoryOptions = DEFAULT_OPTIONS) -> int:
    """Bytes alive during one loss beyond what it saves (module docstring)."""
    d = Dims.of(par, train)
    nv = d.n * _vocab(model, par)
    if train.loss_impl == "torch":
        return 2 * nv * d.e
    if te_cross_entropy(train):
        # TE >= 2.18: the logits (or their gradient) beside the fp32 gradient.
        return nv * d.e if options.te_cross_entropy_fp32_grad else 0
    transient = nv * d.e if d.e != 4 else 0  # fp32 logits are their own .float()
    if train.cross_entropy_loss_fusion:
        transient += nv * 4  # the functionalized copy of the mutated fp32 logits
    return transient


def deferred_wgrad_bytes(model: ModelSpec, par: ParallelSpec, train: TrainSpec,
                         num_microbatches: int) -> int:
    """``--defer-embedding-wgrad-compute``: the output layer's gradient output (the bf16
    logits' gradient, appended to ``grad_output_buffer`` in
    ``LinearWithGradAccumulationAndAsyncCommunication.backward``) and its input
    (``embedding_activation_buffer``, ``ColumnParallelLinear.forward``) of every earlier
    microbatch, up to ``wgrad_deferral_limit`` (0: all), are alive at the last
    microbatch's loss; the flush (``finish_embedding_wgrad_compute``) frees them."""
    if not train.defer_embedding_wgrad_compute:
        return 0
    d = Dims.of(par, train)
    limit = train.wgrad_deferral_limit or num_microbatches
    kept = min(num_microbatches - 1, limit)
    return kept * (d.n * _vocab(model, par) * d.e + d.n_sp * model.hidden_size * d.e)
