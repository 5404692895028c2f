"""Muon's step as project/muon_step.py counts it, against the step replayed op for op
(measure/muon_replica.py, from Emerging-Optimizers v0.1.0 and megatron-core 0.16.1
optimizer/muon.py) and against the golden Muon cases' own model (Megatron-LM functional
test gpt3_moe_mcore_te_ep8_resume_torch_dist_{muon,dist_muon}: 12 layers, hidden 512,
8 heads, 8 experts of 1024 over EP 8)."""
from __future__ import annotations

import pytest

from primus_ext.memory.muon import muon_shard
from primus_ext.memory.states import is_local_spec
from primus_ext.project.muon_step import _owned, muon_matrices, muon_step, weight_kernels

torch = pytest.importorskip("torch")
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from primus_ext.measure import muon_replica  # noqa: E402


@pytest.mark.parametrize("rows,cols,blocks,strided,kw", [
    (16, 32, 1, False, {}),
    (32, 16, 1, False, {}),  # transposed: whitening on the short side
    (24, 16, 3, True, {"split_shapes": (8, 2, 2)}),  # 2 query groups: strided slices
    (12, 16, 3, False, {"split_shapes": (8, 2, 2)}),  # 1 group: contiguous blocks
    (16, 32, 1, False, {"nesterov": True}),
    (16, 32, 1, False, {"weight_decay": 0.0}),
    (16, 32, 1, False, {"steps": 10}),
])
def test_kernels_match_replayed_step(rows, cols, blocks, strided, kw):
    steps = kw.get("steps", 5)
    want = weight_kernels(blocks, strided, steps, nesterov=kw.get("nesterov", False),
                          weight_decay=kw.get("weight_decay", 0.01) != 0.0)
    assert muon_replica.count_kernels(rows, cols, **kw) == want


class _Gemms(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.flops = 0.0
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in ("mm", "addmm"):
            a, b = (args[0], args[1]) if name == "mm" else (args[1], args[2])
            self.flops += 2.0 * a.shape[0] * a.shape[1] * b.shape[1]
            self.count += 1
        return func(*args, **(kwargs or {}))


def _golden(case: str):
    from primus_ext.published.golden import as_runs, read_golden
    return next(r.spec for r in as_runs(read_golden()) if r.run_id == case)


@pytest.fixture(scope="module")
def muon_spec():
    return _golden("gpt3_moe_mcore_te_ep8_resume_torch_dist_muon")


def test_small_model_kernels_and_flops(muon_spec):
    """Per layer: QKV split in three 512 x 512 blocks (8 groups of q, k, v 64 rows: 73
    kernels), proj 512 x 512, router 8 x 512, the local expert's fc1 1024 x 512 and fc2
    512 x 1024 (25 each): 173 kernels; 12 layers."""
    mats = muon_matrices(muon_spec, 0)
    assert len(mats) == 12 * 5
    assert sum(t.kernels for t in mats) == 12 * (73 + 4 * 25) == 2076
    # Each kind of weight's GEMMs and FLOPs as the replayed step dispatches them, at
    # every dimension over 8 (the same GEMM count, FLOPs over 8^3).
    for t in mats[:5]:
        cols = t.blocks[0][1] // 8
        if len(t.blocks) > 1:  # 8 query groups of q, k, v 64 rows each
            kw, rows = {"split_shapes": (8, 8, 8)}, 8 * 24
        else:
            kw, rows = {}, t.blocks[0][0] // 8
        g = _Gemms()
        p, grad, buf = muon_replica._tensors(rows, cols)
        with torch.no_grad(), g:
            muon_replica.weight_step(p, grad, buf, **kw)
        assert g.count == len(t.gemms()) == 15 * len(t.blocks)
        assert t.flops() == pytest.approx(g.flops * 8 ** 3)
    # The memory model's Newton-Schulz FLOPs (memory/muon.py) agree.
    sh = muon_shard(muon_spec.model, muon_spec.parallel, 0, is_local_spec(muon_spec.train))
    assert sum(t.flops() for t in mats) == pytest.approx(sh.ns_flops)


def test_dist_muon_owns_each_weight_once():
    spec = _golden("gpt3_moe_mcore_te_ep8_resume_torch_dist_dist_muon")
    mats = muon_matrices(spec, 0)
    shares = _owned(spec, 0, mats)
    assert len(shares) == 8
    dense = [t.name for s in shares for t in s if not t.expert]
    assert sorted(dense) == sorted(t.name for t in mats if not t.expert)
    # Expert-DP is 1 under EP 8: every rank updates its own expert's weights.
    experts = {t.name for t in mats if t.expert}
    assert all({t.name for t in s if t.expert} == experts for s in shares)
    full, dist = muon_step(_golden("gpt3_moe_mcore_te_ep8_resume_torch_dist_muon"), 0), \
        muon_step(spec, 0)
    assert dist.kernels < full.kernels and dist.gather_collectives == 1
    assert max(sum(t.kernels for t in s) for s in shares) == dist.kernels
