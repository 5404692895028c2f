"""Whole-layer CPU activation offloading (megatron-core ``cpu_offloading``,
``memory/offload.py``) and TE's fused cross entropy (``--cross-entropy-fusion-impl te``)
against byte counts derived from TE's and megatron-core's source, and the legality rules
megatron-core's TransformerConfig.__post_init__ states.

TE cannot run on a CPU: the figures are source-derived (cpu_offload_v1.py
AsyncDoubleBufferGroupOffloadHandler: the first ``num_offload_group`` layer groups'
marked tensors go to the host; cross_entropy.py CrossEntropyFunction.forward saves the
logits, the target and the (m, d, X_y) fp32 row statistics of
triton/cross_entropy.py cross_entropy_forward).
"""
from __future__ import annotations

from dataclasses import replace

import pytest

from memory_specs import LLAMA, run

from primus_ext.memory.activations import chunk_activations, head_items, layer_bytes
from primus_ext.memory.options import MemoryOptions
from primus_ext.memory.report import memory_report, resolved_train
from primus_ext.spec import TrainSpec
from primus_ext.spec.model import padded_vocab

OPT = MemoryOptions()


def _offload(n: int, **kw):
    spec = run(LLAMA, backend="flash", **kw)
    return replace(spec, train=replace(spec.train, te=True, cpu_offloading_num_layers=n))


@pytest.mark.parametrize("n", [1, 3, 7])
def test_offloaded_layers_leave_the_gpu_but_one_in_flight(n):
    spec = _offload(n)
    train = resolved_train(spec)
    per_layer = layer_bytes(spec.model, spec.parallel, train, False, OPT)
    base = chunk_activations(spec.model, spec.parallel, replace(train,
                             cpu_offloading_num_layers=0), 0, 0, OPT)
    off = chunk_activations(spec.model, spec.parallel, train, 0, 0, OPT)
    # The first n of the 8 layers are on the host; one of them is in flight at the peak.
    assert base.bytes_per_microbatch - off.bytes_per_microbatch == n * per_layer
    assert off.working_bytes - base.working_bytes == per_layer
    # One offloaded layer saves nothing at the peak (it is the one in flight).
    saved = memory_report(replace(spec, train=replace(
        spec.train, cpu_offloading_num_layers=0))).peak_bytes - memory_report(spec).peak_bytes
    # (the allocator-fragmentation prior scales with the activation bytes)
    assert abs(saved - (n - 1) * per_layer * (1 + OPT.fragmentation_fraction)) <= 1


def test_megatron_core_rules_for_cpu_offloading():
    with pytest.raises(ValueError, match="cpu_offloading_num_layers.*recompute"):
        TrainSpec(cpu_offloading_num_layers=2, recompute_granularity="selective")
    with pytest.raises(ValueError, match="cpu_offloading_num_layers.*>= 0"):
        TrainSpec(cpu_offloading_num_layers=-1)
    with pytest.raises(ValueError, match="pp=1"):
        _offload(2, pp=2)
    with pytest.raises(ValueError, match="below the model's 8 layers"):
        _offload(8)


def test_te_cross_entropy_saves_its_gradient_in_place_or_in_fp32():
    spec = run(LLAMA, backend="flash")
    n = spec.train.seq_length * spec.train.micro_batch_size
    v = padded_vocab(LLAMA.vocab_size, LLAMA.make_vocab_size_divisible_by, 1)
    fused = replace(spec.train, cross_entropy_loss_fusion=True,
                    cross_entropy_fusion_impl="te")
    # TE <= 2.17 (transformer_engine/pytorch/triton/cross_entropy.py before #3193): the
    # kernel writes the gradient into the bf16 logits, which CrossEntropyFunction saves.
    te_items = head_items(LLAMA, spec.parallel, fused)
    assert te_items["loss.logits"] == n * v * 2
    assert "loss.exp_logits" not in te_items
    # TE >= 2.18: grad_input = torch.empty_like(_input, dtype=torch.float32), saved.
    opt218 = MemoryOptions(te_cross_entropy_fp32_grad=True)
    te218 = head_items(LLAMA, spec.parallel, fused, options=opt218)
    assert te218["loss.grad_input"] == n * v * 4 and "loss.logits" not in te218
    native = head_items(LLAMA, spec.parallel, replace(fused, cross_entropy_fusion_impl=
                                                      "native"))
    assert native["loss.exp_logits"] == n * v * 4
    # Transients (head.py): the eager loss and TE 2.18 keep the bf16 logits (or their
    # gradient) beside the fp32 tensor; the compiled native fusion also clones the fp32
    # softmax it mutates in calculate_gradients; TE <= 2.17 works in place.
    last_native = chunk_activations(LLAMA, spec.parallel, replace(fused,
                                    cross_entropy_fusion_impl="native"), 0, 0, OPT)
    last_te = chunk_activations(LLAMA, spec.parallel, fused, 0, 0, OPT)
    last_te218 = chunk_activations(LLAMA, spec.parallel, fused, 0, 0, opt218)
    last_eager = chunk_activations(LLAMA, spec.parallel, spec.train, 0, 0, OPT)
    assert last_te.working_bytes == 0
    assert last_te218.working_bytes == last_eager.working_bytes == n * v * 2
    assert last_native.working_bytes - last_eager.working_bytes == n * v * 4
    with pytest.raises(ValueError, match="cross_entropy_fusion_impl"):
        TrainSpec(cross_entropy_fusion_impl="triton")
