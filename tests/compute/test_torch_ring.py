"""PyTorch context_parallel (torchtitan's CP) against torch's own ring attention.

torch's ``_templated_ring_attention`` and its backward (torch/distributed/tensor/
experimental/_context_parallel/_attention.py in the installed torch; the same loop as
torch 2.5-2.6's ``_attention.py``) run here in one process on a fake process group of
``cp`` ranks, with a stand-in attention op: the collectives they issue (kind, bytes,
dtype) are recorded and compared with what ``comm/layer_comm.torch_ring_comms`` charges.
"""
from __future__ import annotations

import pytest
from sim_specs import run

from primus_ext.compute.layer_ops import attention_ops
from primus_ext.compute.ops import Shapes
from primus_ext.compute.torch_ring import is_torch_ring
from primus_ext.project.simulate_backend import simulate_layer_costs
from primus_ext.spec import ModelSpec

torch = pytest.importorskip("torch")


def tiny(**kw) -> ModelSpec:
    base = dict(name="tiny", num_layers=2, hidden_size=128, num_attention_heads=8,
                num_query_groups=2, ffn_hidden_size=256, vocab_size=512)
    base.update(kw)
    return ModelSpec(**base)


def torch_cp(cp: int, **train):
    tr = dict(seq_length=512, global_batch_size=8, te=False)
    tr.update(train)
    return run(tiny(), cp=cp, cp_comm_type="allgather", train=tr)


def _record_ring(spec):
    """Collectives of torch's ring forward and backward on the busiest rank (the last)."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore
    from torch.utils._python_dispatch import TorchDispatchMode
    ring = pytest.importorskip(
        "torch.distributed.tensor.experimental._context_parallel._attention")

    from torch.utils._pytree import tree_flatten
    calls: list[tuple[str, int, object]] = []
    moved = {"on": True, "bytes": 0}

    class Record(TorchDispatchMode):
        """Collectives (kind, input bytes, dtype) and the bytes every other kernel reads
        and writes (views and the stand-in attention op excluded; fills write only)."""
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            name = str(func)
            if "all_gather_into_tensor" in name or "all_to_all_single" in name:
                t = args[0]
                calls.append((name, t.numel() * t.element_size(), t.dtype))
            elif moved["on"] and not func.is_view and not any(
                    k in name for k in ("c10d", "_unsafe_view")):
                ins = [] if "zeros" in name else tree_flatten((args, kwargs))[0]
                moved["bytes"] += sum(t.numel() * t.element_size()
                                      for t in ins + tree_flatten(out)[0]
                                      if isinstance(t, torch.Tensor))
            return out

    def op(q, k, v, is_causal=False, **kw):  # stands in for the flash op: (out, lse)
        moved["on"] = False
        res = torch.zeros_like(q), torch.zeros(q.shape[:3], dtype=torch.float32)
        moved["on"] = True
        return res

    def op_bwd(query, key, value, out, logsumexp, is_causal=False, **kw):
        moved["on"] = False
        res = torch.zeros_like(query), torch.zeros_like(key), torch.zeros_like(value)
        moved["on"] = True
        return res

    cp = spec.parallel.cp
    m, t = spec.model, spec.train
    # torchtitan repeats K/V to the query heads before SDPA (repeat_kv) and transposes
    # (b, s/cp, heads, d) to (b, heads, s/cp, d): strided views
    shape = (t.micro_batch_size, t.seq_length // cp, m.num_attention_heads, m.head_dim)
    q, k, v = (torch.randn(shape, dtype=torch.bfloat16).transpose(1, 2) for _ in range(3))
    dist.init_process_group("fake", store=FakeStore(), rank=cp - 1, world_size=cp)
    try:
        g = dist.group.WORLD
        with Record():
            out, lse = ring._templated_ring_attention(g, 2, op, q, k, v, is_causal=True)[:2]
        fwd, fwd_bytes = list(calls), moved["bytes"]
        calls.clear()
        moved["bytes"] = 0
        with Record():
            ring._templated_ring_attention_backward(
                g, 2, op_bwd, grad_out=out, grad_out_name="grad_out", query=q, key=k,
                value=v, out=out, logsumexp=lse, is_causal=True)
        return fwd, list(calls), fwd_bytes, moved["bytes"]
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("cp", [2, 4])
def test_ring_collectives_match_torch(cp):
    spec = torch_cp(cp)
    fwd, bwd, _, _ = _record_ring(spec)
    ours = {c.name: c for c in simulate_layer_costs(spec).kinds["dense"].comms
            if c.axis == "cp"}
    assert set(ours) == {"attn.cp_all_gather", "attn.cp_all_gather_bwd", "attn.cp_dkv_rotate"}
    # forward: one all-gather of the local K and V (input bytes x cp ranks gathered)
    assert [n for n, _, _ in fwd] == ["_c10d_functional.all_gather_into_tensor.default"]
    assert ours["attn.cp_all_gather"].num_bytes == fwd[0][1] * cp
    # backward: the same gather, then one fp32 dK/dV all-to-all (permute) per step
    gathers = [c for c in bwd if "all_gather" in c[0]]
    rotates = [c for c in bwd if "all_to_all" in c[0]]
    assert len(gathers) == 1 and ours["attn.cp_all_gather_bwd"].num_bytes == gathers[0][1] * cp
    assert len(rotates) == cp and all(dt == torch.float32 for _, _, dt in rotates)
    assert ours["attn.cp_dkv_rotate"].num_bytes == sum(b for _, b, _ in rotates)
    # the last rotation is waited after the loop: never hidden
    rot = ours["attn.cp_dkv_rotate"]
    assert rot.exposed_s >= rot.seconds / cp


def test_ring_merge_only_for_torch_cp():
    """The merge / fp32 accumulation work exists for PyTorch's ring (cp > 1, no TE) only;
    compiled it moves fewer bytes than eager and grows with the ring's steps."""
    def merge(spec):
        sh = Shapes(spec)
        hit = [o for o in attention_ops(sh, None) if o.name == "cp_ring_merge"]
        assert bool(hit) == is_torch_ring(sh)
        return hit[0] if hit else None

    assert merge(torch_cp(1)) is None
    assert merge(torch_cp(2, te=True)) is None
    eager = merge(torch_cp(4, fused_elementwise=False))
    fused = merge(torch_cp(4, fused_elementwise=True))
    assert fused.fwd_bytes < eager.fwd_bytes and fused.bwd_bytes < eager.bwd_bytes
    assert fused.module == "core_attn"  # recomputed with the attention
    # same local rows (seq / cp fixed), twice the ring steps: more merge work
    assert merge(torch_cp(8, seq_length=1024)).fwd_bytes > merge(
        torch_cp(4, seq_length=512)).fwd_bytes


@pytest.mark.parametrize("cp", [2, 4, 8])
def test_eager_ring_bytes_match_torch(cp):
    """Eager (no torch.compile): the bytes torch's ring moves between its attention
    calls, counted kernel by kernel on the busiest rank, against ``ring_merge_op``.
    Head dim 256 keeps the LSE-sized kernels (1/d of the rest, not modelled) small."""
    spec = run(tiny(hidden_size=512, num_attention_heads=2, num_query_groups=1),
               cp=cp, cp_comm_type="allgather",
               train=dict(seq_length=256 * cp, global_batch_size=8, te=False,
                          fused_elementwise=False))
    _, _, fwd_bytes, bwd_bytes = _record_ring(spec)
    op = [o for o in attention_ops(Shapes(spec), None) if o.name == "cp_ring_merge"][0]
    assert op.fwd_bytes == pytest.approx(fwd_bytes, rel=0.02)
    assert op.bwd_bytes == pytest.approx(bwd_bytes, rel=0.02)


def _traced_ring_order(cp: int) -> tuple[list[str], list[str]]:
    """Collectives, waits and attention calls, in order, of torch's ring forward and
    backward traced by make_fx (the tracing torch.compile's AOT autograd does), on the
    busiest rank of a fake ``cp``-rank group, with the CPU flash kernels as the op."""
    import torch.distributed as dist
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.testing._internal.distributed.fake_pg import FakeStore
    ring = pytest.importorskip(
        "torch.distributed.tensor.experimental._context_parallel._attention")
    aten = torch.ops.aten

    def op(q, k, v, is_causal=False, **kw):
        return aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, is_causal=is_causal)

    def op_bwd(grad_out, query, key, value, out, logsumexp, is_causal=False, **kw):
        return aten._scaled_dot_product_flash_attention_for_cpu_backward(
            grad_out, query, key, value, out, logsumexp, 0.0, is_causal)

    def order(gm) -> list[str]:
        names = [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
        return [n.split(".")[1] for n in names if "c10d" in n or "flash_attention" in n]

    dist.init_process_group("fake", store=FakeStore(), rank=cp - 1, world_size=cp)
    try:
        g = dist.group.WORLD
        q, k, v, do = (torch.randn(1, 2, 64 * cp // 2, 16) for _ in range(4))
        lse = torch.randn(1, 2, 64 * cp // 2)
        fwd = make_fx(lambda q, k, v: ring._templated_ring_attention(
            g, 2, op, q, k, v, is_causal=True)[:2], tracing_mode="fake")(q, k, v)
        bwd = make_fx(lambda do, q, k, v, o, lse: ring._templated_ring_attention_backward(
            g, 2, op_bwd, grad_out=do, grad_out_name="grad_out", query=q, key=k, value=v,
            out=o, logsumexp=lse, is_causal=True), tracing_mode="fake")(do, q, k, v, q, lse)
        return order(fwd), order(bwd)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("cp", [2, 4])
def test_compiled_ring_waits_every_collective_at_once(cp):
    """Traced, torch's functional collectives wait right after they are issued
    (``_functional_collectives._maybe_wrap_tensor``): no attention call runs between a
    collective and its wait, so under torch.compile (train.fused_elementwise in the
    torchtitan view) the K/V gathers and every dK/dV rotation are exposed; eager, the
    gathers hide behind the first (local) step. Inductor keeps this order in a training
    graph: tests/slow/test_torch_ring_compiled.py."""
    fwd, bwd = _traced_ring_order(cp)
    assert fwd == ["all_gather_into_tensor", "wait_tensor"] + [
        "_scaled_dot_product_flash_attention_for_cpu"] * cp
    for seq in (fwd, bwd):
        for i, name in enumerate(seq):
            if name in ("all_gather_into_tensor", "all_to_all_single"):
                assert seq[i + 1] == "wait_tensor"
    assert bwd.count("all_to_all_single") == cp
    comms = {}
    for fused in (True, False):
        spec = torch_cp(cp, fused_elementwise=fused)
        comms[fused] = {c.name: c for c in simulate_layer_costs(spec).kinds["dense"].comms
                        if c.axis == "cp"}
    for c in comms[True].values():
        assert c.exposed_s == pytest.approx(c.seconds)
    for name in ("attn.cp_all_gather", "attn.cp_all_gather_bwd", "attn.cp_dkv_rotate"):
        assert comms[False][name].exposed_s < comms[True][name].exposed_s
        assert comms[False][name].seconds == pytest.approx(comms[True][name].seconds)
