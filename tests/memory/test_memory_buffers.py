"""DDP grad/param buffer layout and optimizer shards (memory/grad_buffer.py, states.py)."""
from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from memory_specs import LLAMA, run
from primus_ext.memory.grad_buffer import buffer_layout
from primus_ext.memory.options import MemoryOptions
from primus_ext.memory.rank_params import ParamTensor
from primus_ext.memory.states import stage_states


def _tensors(sizes, shared=()):
    return tuple(ParamTensor(f"p{i}", n, shared_embedding=i in shared)
                 for i, n in enumerate(sizes))


def test_without_distributed_optimizer_no_padding():
    lay = buffer_layout(_tensors([100, 3, 77]), dp=8, distopt=False, bucket_size=None)
    assert lay.numel == 180 and len(lay.buckets) == 1


def test_distributed_optimizer_aligns_params_and_pads_buckets():
    # Walked in reverse: 77 -> [0, 77), 3 -> [128, 131), 100 -> [192, 292); end padded to
    # lcm(dp=3, 128) = 384.
    lay = buffer_layout(_tensors([100, 3, 77]), dp=3, distopt=True, bucket_size=None)
    assert lay.numel == 384
    b = lay.buckets[0]
    assert b.param_starts == (0, 128, 192) and b.param_ends == (77, 131, 292)


def test_buckets_close_at_bucket_size_and_around_shared_embedding():
    sizes = [1000, 10, 10, 10, 500]
    lay = buffer_layout(_tensors(sizes, shared={0}), dp=2, distopt=True, bucket_size=520)
    # reverse order: 500 -> 10 (>= 520 closes) | 10, 10 | shared 1000 alone
    assert len(lay.buckets) == 3
    assert all((b.end - b.start) % math.lcm(2, 128) == 0 for b in lay.buckets)
    assert lay.buckets[-1].param_ends[0] - lay.buckets[-1].param_starts[0] == 1000


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 5000), min_size=1, max_size=30), st.integers(1, 16),
       st.one_of(st.none(), st.integers(100, 20000)))
def test_shards_cover_every_real_element_once(sizes, dp, bucket):
    lay = buffer_layout(_tensors(sizes), dp=dp, distopt=True, bucket_size=bucket)
    assert sum(lay.shard_real_elements(dp, r) for r in range(dp)) == sum(sizes)
    assert lay.numel % dp == 0 and lay.numel >= sum(sizes)
    assert lay.max_shard_real_elements(dp) == max(lay.shard_real_elements(dp, r)
                                                  for r in range(dp))


def test_bytes_per_param_match_megatron_formula_up_to_padding():
    # Megatron-LM theoretical_memory_usage: 18 bytes/param without the distributed
    # optimizer, 6 + 12/dp with it (bf16 params, fp32 grads and Adam state).
    for distopt, per_param in ((False, lambda dp: 18), (True, lambda dp: 6 + 12 / dp)):
        spec = run(LLAMA, gpus=8, use_distributed_optimizer=distopt)
        s = stage_states(spec.model, spec.parallel, spec.train, 0, spec.dp, spec.expert_dp,
                         MemoryOptions())
        total = s.param_bytes + s.grad_bytes + s.optimizer_bytes
        ideal = per_param(spec.dp) * s.num_params
        assert ideal <= total <= ideal * 1.001


def test_bf16_grads_halve_the_grad_buffer():
    spec = run(LLAMA, gpus=8)
    args = (spec.model, spec.parallel, spec.train, 0, spec.dp, spec.expert_dp)
    fp32 = stage_states(*args, MemoryOptions()).grad_bytes
    bf16 = stage_states(*args, MemoryOptions(grad_reduce_in_fp32=False)).grad_bytes
    assert fp32 == 2 * bf16
