"""The flex dispatcher's SM count (--moe-deepep-num-sms / --moe-hybridep-num-sms, Megatron-LM
main's --moe-flex-dispatcher-num-sms): read as megatron-core passes it, and costed by the
published bandwidth of DeepEP / HybridEP at that many SMs (deepseek-ai/DeepEP@94a9f8f6b146,
hybrid-ep branch, docs/README_Hybrid-EP.md) and by the compute it takes while overlapped."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from primus_ext import compose
from primus_ext.comm.groups import group_span
from primus_ext.comm.moe_comm import DEEPEP_NUM_SMS, HYBRIDEP_NUM_SMS, flex_dispatch_s, \
    flex_num_sms
from primus_ext.comm.overlap import sm_share_penalty
from primus_ext.frameworks.megatron.args import parse_launch_args
from primus_ext.frameworks.megatron.flags import megatron_argv
from primus_ext.presets import hardware_preset
from primus_ext.spec import HardwareSpec

# GB200 NVL72, 8 ranks, 4096 tokens x 7168, BF16, Torch API (the page's GB200 table):
# DeepEP (dispatch, combine) GB/s at 16 / 24 / 32 SMs; the B200 preset holds the B200
# table of the same page (same die and NVLink 5).
GB200_DEEPEP = {16: (362.01, 310.21), 24: (512.72, 425.95), 32: (615.78, 519.57)}


def test_defaults_and_routing_are_megatron_cores():
    """megatron-core's TransformerConfig defaults, and its dispatcher hands each count to
    its own backend only (token_dispatcher.py: HybridEP's num_sms_dispatch_api /
    num_sms_combine_api from moe_hybridep_num_sms; set_deepep_num_sms from
    moe_deepep_num_sms)."""
    from megatron.core.transformer import moe
    from megatron.core.transformer.transformer_config import TransformerConfig
    fields = {f.name: f for f in dataclasses.fields(TransformerConfig)}
    assert fields["moe_deepep_num_sms"].default == DEEPEP_NUM_SMS == 20
    assert fields["moe_hybridep_num_sms"].default == HYBRIDEP_NUM_SMS == 16
    src = (Path(moe.__file__).parent / "token_dispatcher.py").read_text()
    assert "num_sms_dispatch_api=self.config.moe_hybridep_num_sms" in src
    assert "set_deepep_num_sms(config.moe_deepep_num_sms)" in src


def _line(*extra):
    return ["--num-layers", "4", "--hidden-size", "1024", "--num-attention-heads", "8",
            "--num-experts", "64", "--moe-router-topk", "4", "--expert-model-parallel-size",
            "8", "--moe-token-dispatcher-type", "flex", "--seq-length", "4096",
            "--max-position-embeddings", "4096", "--micro-batch-size", "1",
            "--global-batch-size", "64", "--bf16", "--target-hardware", "b200", *extra]


@pytest.mark.parametrize("extra,sms", [
    ((), DEEPEP_NUM_SMS),
    (("--moe-deepep-num-sms", "32"), 32),
    (("--moe-hybridep-num-sms", "32"), DEEPEP_NUM_SMS),  # the other backend's: not read
    (("--moe-flex-dispatcher-backend", "hybridep"), HYBRIDEP_NUM_SMS),
    (("--moe-flex-dispatcher-backend", "hybridep", "--moe-hybridep-num-sms", "32"), 32),
    (("--moe-flex-dispatcher-backend", "hybridep", "--moe-deepep-num-sms", "32"),
     HYBRIDEP_NUM_SMS),
    (("--moe-deepep-num-sms", "24", "--moe-flex-dispatcher-num-sms", "40"), 40),
])
def test_the_launch_line_sets_the_kernels_sms(extra, sms):
    la = parse_launch_args(_line(*extra))
    assert flex_num_sms(la.spec.parallel) == sms
    assert not [f for f in la.not_modelled if "num-sms" in f], la.not_modelled
    back = parse_launch_args(megatron_argv(la.spec) + ["--target-hardware", "b200"])
    assert flex_num_sms(back.spec.parallel) == sms


def test_the_b200_curve_holds_on_gb200():
    """The B200 points, read at the GB200 table's SM counts, against GB200's own figures
    (mean of dispatch and combine over NVLink's 900 GB/s): within 4 %."""
    b200 = hardware_preset("b200")
    for sms, (d, c) in GB200_DEEPEP.items():
        assert b200.flex_efficiency("deepep", sms) == pytest.approx((d + c) / 2 / 900,
                                                                    rel=0.04)


def test_efficiency_law_between_and_beyond_the_points():
    hw = hardware_preset("b200")
    e16, e24 = hw.flex_efficiency("deepep", 16), hw.flex_efficiency("deepep", 24)
    assert hw.flex_efficiency("deepep", 20) == pytest.approx((e16 + e24) / 2)
    assert hw.flex_efficiency("deepep", 8) == pytest.approx(e16 / 2)  # SMs move a share each
    assert hw.flex_efficiency("deepep", 132) == hw.deepep_efficiency_by_sms[-1][1]
    assert hardware_preset("cpu").flex_efficiency("deepep", 20) is None


def test_more_sms_dispatch_faster_and_cost_more_compute_when_overlapped():
    spec = compose(["model=deepseek_v3", "cluster.hardware=b200", "cluster.num_nodes=1",
                    "parallel.ep=8", "parallel.pp=1", "parallel.moe_token_dispatcher_type=flex",
                    "train.global_batch_size=64"])
    span = group_span(spec, "ep")
    hw = spec.cluster.hardware
    t = {}
    for sms in (16, 32):
        s = dataclasses.replace(spec, parallel=dataclasses.replace(spec.parallel,
                                                                   moe_flex_num_sms=sms))
        t[sms] = flex_dispatch_s(s, span, 4096, 7168 * 2) - hw.scale_up_latency_s
    ratio = hw.flex_efficiency("deepep", 32) / hw.flex_efficiency("deepep", 16)
    assert t[16] / t[32] == pytest.approx(ratio, rel=1e-9)
    assert sm_share_penalty(hw, 32) == pytest.approx(2 * sm_share_penalty(hw, 16))


@pytest.mark.parametrize("points,msg", [
    ([[16, 0.5], [16, 0.6]], "SM counts must rise"),
    ([[16, 1.5]], "efficiency in (0, 1]"),
    ([[16]], "pairs"),
])
def test_bad_points_name_the_field(points, msg):
    with pytest.raises(ValueError, match="hardware.deepep_efficiency_by_sms") as exc:
        HardwareSpec(name="x", bf16_tflops=1.0, hbm_bytes=1, hbm_gbps=1.0, scale_up_gbps=1.0,
                     scale_out_gbps=1.0, deepep_efficiency_by_sms=points)
    assert msg in str(exc.value)
