"""How megatron-core runs the local experts (layer_ops.expert_mlp_ops) and what the flex
dispatcher spares (layer_ops.moe_ops).

- TEGroupedMLP (--moe-grouped-gemm): one GEMM per expert on Transformer Engine's four
  streams; SequentialMLP (without it, megatron-core moe/experts.py: ``for expert in
  self.local_experts``): the same GEMMs one after another, so at a few hundred rows per
  expert most SMs idle; the fused grouped MLP (use_transformer_engine_op_fuser, TE's
  CuTe DSL kernel): one grouped kernel per GEMM, no activation kernel, fc2's input
  written quantised by fc1's epilogue.
- FP8 grouped GEMMs of a dropless MoE pad every expert's rows (Transformer Engine
  Fp8Padding, megatron-core TEGroupedMLP.forward): two row copies forward and two
  backward, none with token dropping padded to capacity or router-side padding.
- Their operands are quantised per expert, as Transformer Engine's GroupedLinear does
  (tests/data/te_grouped_quantize/kernels.json): one fused kernel for all experts only
  under delayed scaling, three per expert under current scaling.
- An expert fc2 bias (gpt-oss) is added per expert in eager PyTorch (megatron-core
  TEGroupedMLP._apply_bias), outside the fused grouped MLP.
- The flex dispatcher sends tokens unpermuted: DeepEP permutes the received rows once,
  HybridEP inside its kernels; the alltoall dispatcher permutes before and sorts after.
"""
from __future__ import annotations

import dataclasses
import json
from importlib.util import find_spec
from pathlib import Path

from sim_specs import run
from primus_ext.compute.layer_ops import moe_ops
from primus_ext.compute.ops import Shapes
from primus_ext.spec import ModelSpec


def _qwen(**kw) -> ModelSpec:
    base = dict(name="qwen3_30b", num_layers=4, hidden_size=2048, num_attention_heads=32,
                num_query_groups=4, kv_channels=128, ffn_hidden_size=6144,
                vocab_size=151936, num_moe_experts=128, moe_router_topk=8,
                moe_ffn_hidden_size=768)
    base.update(kw)
    return ModelSpec(**base)


def _ops(model=None, train=None, **par):
    spec = run(model or _qwen(), ep=8, nodes=1, train=train or {}, **par)
    return {o.name: o for o in moe_ops(Shapes(spec))}


def _t(o):
    return o.fwd_s + o.dgrad_s + o.wgrad_s


def test_hardware_queues_cap_the_grouped_gemm_streams():
    # HIP GPU_MAX_HW_QUEUES=2 (AMD Primus examples/moe_package run scripts): the four
    # streams share two hardware queues, so two experts' GEMMs run at once; one queue
    # runs them one after another, as the per-expert loop does; more queues than
    # streams change nothing.
    short = dict(seq_length=512)  # 256 rows per local expert
    four = _ops(train=short)
    two = _ops(train=dict(short, device_hw_queues=2))
    one = _ops(train=dict(short, device_hw_queues=1))
    many = _ops(train=dict(short, device_hw_queues=8))
    loop = _ops(moe_grouped_gemm=False, train=short)
    for name in ("experts_fc1", "experts_fc2"):
        assert _t(four[name]) < _t(two[name]) < _t(one[name]), name
        assert _t(one[name]) == _t(loop[name]), name
        assert _t(many[name]) == _t(four[name]), name
        assert two[name].fwd_kernels == four[name].fwd_kernels == 16


def test_unfused_gradient_accumulation_adds_the_wgrad_into_main_grad():
    # --no-gradient-accumulation-fusion: the wgrad GEMM writes .grad and megatron-core's
    # DDP hook runs main_grad.add_(grad), one kernel per expert weight: slower weight
    # gradients, the same forward and input gradients.
    fused = _ops()
    unfused = _ops(train=dict(gradient_accumulation_fusion=False))
    for name in ("experts_fc1", "experts_fc2"):
        f, u = fused[name], unfused[name]
        assert u.wgrad_s > f.wgrad_s, name
        assert (u.fwd_s, u.dgrad_s) == (f.fwd_s, f.dgrad_s), name
        assert u.bwd_kernels == f.bwd_kernels + 16, name  # 16 local experts


def test_sequential_experts_are_slower_than_four_streams_at_small_rows():
    short = dict(seq_length=512)  # 512 tokens x 8 over 16 local experts: 256 rows each
    grouped = _ops(train=short)
    loop = _ops(moe_grouped_gemm=False, train=short)
    for name in ("experts_fc1", "experts_fc2"):
        assert loop[name].fwd_kernels == grouped[name].fwd_kernels == 16
        assert _t(loop[name]) > 1.5 * _t(grouped[name]), name


def test_fused_grouped_mlp_is_one_kernel_without_activation():
    fused = _ops(moe_fused_grouped_mlp=True, train=dict(precision="fp8",
                                                        fp8_recipe="mxfp8"))
    plain = _ops(train=dict(precision="fp8", fp8_recipe="mxfp8"))
    assert "experts_act" not in fused and "experts_act" in plain
    assert fused["experts_fc1"].fwd_kernels == 1 + 1  # one grouped GEMM and its input cast
    assert fused["experts_fc2"].fwd_kernels == 1  # input written quantised by fc1
    assert plain["experts_fc2"].fwd_kernels == 16 + 16  # a GEMM and an MXFP8 cast per expert
    total = sum(_t(o) for n, o in fused.items() if n.startswith("experts"))
    assert total < sum(_t(o) for n, o in plain.items() if n.startswith("experts"))


def test_fp8_dropless_experts_pad_their_rows():
    fp8 = dict(precision="fp8")
    assert {"fp8_padding", "fp8_unpadding"} <= set(_ops(train=fp8))
    assert "fp8_padding" not in _ops()  # bf16
    # router-side padding (--moe-router-padding-for-fp8) or capacity padding: no copies
    assert "fp8_padding" not in _ops(train=fp8, moe_router_terms=("padding",))
    capped = _qwen(moe_expert_capacity_factor=1.0, moe_pad_expert_input_to_capacity=True)
    assert "fp8_padding" not in _ops(model=capped, train=fp8)


def test_flex_dispatchers_skip_the_alltoall_permutations():
    a2a = _ops()
    deepep = _ops(moe_token_dispatcher_type="flex", moe_flex_dispatcher_backend="deepep")
    hybrid = _ops(moe_token_dispatcher_type="flex", moe_flex_dispatcher_backend="hybridep")
    assert {"permute", "sort_chunks", "unsort_chunks", "unpermute"} <= set(a2a)
    assert {"permute", "unpermute"} <= set(deepep)
    assert "sort_chunks" not in deepep
    assert not {"permute", "sort_chunks", "unsort_chunks", "unpermute"} & set(hybrid)
    assert _t(deepep["permute"]) < _t(a2a["permute"]) + _t(a2a["sort_chunks"])


TE_QUANTIZE = Path(__file__).resolve().parents[1] / "data" / "te_grouped_quantize" / "kernels.json"


def test_fp8_grouped_casts_launch_per_expert_as_transformer_engine_does():
    facts = json.loads(TE_QUANTIZE.read_text())["per_recipe"]
    for recipe, k in facts.items():
        ops = _ops(train=dict(precision="fp8", fp8_recipe=recipe))
        casts = k["fixed"] + 16 * k["per_expert"]  # 16 local experts
        for name in ("experts_fc1", "experts_fc2"):
            assert ops[name].fwd_kernels == 16 + casts, (recipe, name)
            assert ops[name].bwd_kernels == 2 * 16 + casts, (recipe, name)
    # the launches are device time too: current scaling's 48 casts outlast delayed's one
    cs = _ops(train=dict(precision="fp8", fp8_recipe="tensorwise"))
    ds = _ops(train=dict(precision="fp8", fp8_recipe="delayed"))
    assert cs["experts_fc1"].fwd_s > ds["experts_fc1"].fwd_s


def _apply_bias_source() -> str:
    core = Path(find_spec("megatron.core").submodule_search_locations[0])
    text = (core / "transformer" / "moe" / "experts.py").read_text()
    start = text.index("def _apply_bias(")
    return text[start:text.index("def ", start + 10)]


def test_expert_fc2_bias_is_added_per_expert_in_eager_pytorch():
    src = _apply_bias_source()  # the installed megatron-core's own code
    assert "torch.split(" in src and "torch.cat(" in src and "b * p" in src
    biased = _ops(model=_qwen(add_bias_linear=True))
    op = biased["experts_fc2_bias"]
    assert (op.fwd_kernels, op.bwd_kernels) == (2 * 16 + 1, 4 * 16)
    assert op.fwd_bytes == op.bwd_bytes > 0
    assert "experts_fc2_bias" not in _ops()  # no bias
    mx = dict(precision="fp8", fp8_recipe="mxfp8")
    fused = _ops(model=_qwen(add_bias_linear=True), moe_fused_grouped_mlp=True, train=mx)
    assert "experts_fc2_bias" not in fused  # the op fuser scales the bias itself
