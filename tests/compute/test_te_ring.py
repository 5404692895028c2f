"""Transformer Engine's p2p context-parallel ring (megatron-core's default CP): the
output, LSE and gradient corrections ``AttnFuncWithCPAndKVP2P`` runs between and after
its flash calls (compute/te_ring.py), counted for the busiest rank from TE's loop."""
from __future__ import annotations

from sim_specs import dsv3, mixtral, run

from primus_ext.compute.layer_ops import attention_ops
from primus_ext.compute.ops import Shapes
from primus_ext.compute.te_ring import is_te_p2p_ring


def te_cp(cp: int, model=None, **par):
    p = dict(tp=1, cp=cp)
    p.update(par)
    return run(model or mixtral(), train=dict(seq_length=8192, te=True), **p)


def correction(spec):
    sh = Shapes(spec)
    hit = [o for o in attention_ops(sh, None) if o.name == "cp_ring_correction"]
    assert bool(hit) == is_te_p2p_ring(sh)
    return hit[0] if hit else None


def test_only_the_te_p2p_ring_corrects():
    assert correction(te_cp(1)) is None
    assert correction(te_cp(4, cp_comm_type="a2a")) is None  # Ulysses: one call, no merge
    assert correction(te_cp(4, cp_comm_type="allgather")) is None
    unfused = run(mixtral(), cp=4, train=dict(seq_length=8192, te=True,
                                             attention_backend="unfused"))
    assert correction(unfused) is None
    op = correction(te_cp(4))
    assert op.module == "core_attn"  # a recomputed core attention re-runs it


def test_bytes_follow_te_loop_at_two_ranks():
    """cp = 2, rank 1 (mixtral: 32 heads, 8 K/V groups, head dim 128, bf16): forward
    ``torch.cat`` of K and V (read and write), the init correction (read, write) and one
    full correction (read the partial output, read and write ``out``); backward the K/V
    copy into the ring buffer, dQ copied then added, dK/dV's first half copied at step 0
    and the full dK/dV added at the last step."""
    op = correction(te_cp(2))
    rows = 8192 / 2
    q = o = rows * 32 * 128
    kv = rows * 8 * 256
    assert op.fwd_bytes == 2 * 2 * kv + 2 * o * (2 + 3)
    assert op.bwd_bytes == 2 * 2 * kv + 2 * q * (2 + 3) + 2 * kv * (1 + 3)
    assert op.fwd_kernels == 5 and op.bwd_kernels == 7


def test_ring_work_grows_with_its_steps_and_uses_mla_heads():
    # the same local rows, twice the steps: more correction work per layer
    a = correction(run(mixtral(), cp=4, train=dict(seq_length=8192, te=True)))
    b = correction(run(mixtral(), cp=8, train=dict(seq_length=16384, te=True)))
    assert b.fwd_bytes > 1.5 * a.fwd_bytes and b.bwd_bytes > 1.5 * a.bwd_bytes
    # MLA: K carries every head (no groups), at qk + rope dims; V at v_head_dim
    mla = correction(te_cp(2, model=dsv3(), tp=4, sequence_parallel=True))
    rows, heads = 8192 / 2, 128 / 4
    kv = rows * heads * (192 + 128)
    o = rows * heads * 128
    assert mla.fwd_bytes == 2 * 2 * kv + 2 * o * 5
