"""GEMM time model: shape efficiency, monotonicity, and the published sweeps it claims."""
from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from primus_ext.compute.gemm import (WGRAD_OUT_BYTES, WGRAD_SOURCE_BYTES,
                                     achieved_efficiency, gemm_time_s)
from primus_ext.presets import hardware_preset, list_presets

GPUS = [n for n in list_presets("hardware") if n != "cpu"]
dims = st.integers(min_value=1, max_value=512).map(lambda x: 64 * x)
any_dims = st.integers(min_value=1, max_value=40000)
dtypes = st.sampled_from(["bf16", "fp8", "fp32"])


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(GPUS), any_dims, any_dims, any_dims, dtypes, st.booleans())
def test_efficiency_in_unit_interval(gpu, m, n, k, dtype, grouped):
    hw = hardware_preset(gpu)
    batch = 4 if grouped else 1
    e = achieved_efficiency(hw, m, n, k, dtype=dtype, batch=batch, grouped=grouped)
    assert 0 < e <= 1


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(GPUS), dims, dims, dims, dtypes, st.integers(1, 3),
       st.integers(1, 4096))
def test_bigger_gemm_never_faster(gpu, m, n, k, dtype, axis, extra):
    hw = hardware_preset(gpu)
    t0 = gemm_time_s(hw, m, n, k, dtype=dtype)
    grown = [m, n, k]
    grown[axis - 1] += extra
    assert gemm_time_s(hw, *grown, dtype=dtype) >= t0


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(GPUS), any_dims, any_dims, any_dims, dtypes,
       st.floats(1.0, 4.0), st.sampled_from(["hbm_gbps", "bf16_tflops", "fp8_tflops"]))
def test_more_bandwidth_or_flops_never_slower(gpu, m, n, k, dtype, factor, field):
    hw = hardware_preset(gpu)
    if getattr(hw, field) is None:
        return
    faster = replace(hw, **{field: getattr(hw, field) * factor})
    assert gemm_time_s(faster, m, n, k, dtype=dtype) <= gemm_time_s(hw, m, n, k, dtype=dtype)


def test_skinny_and_grouped_gemms_are_much_less_efficient():
    hw = hardware_preset("h100")
    big = achieved_efficiency(hw, 8192, 8192, 8192)
    assert big > 0.7
    # 64/128-row GEMMs are memory-bound (achievable-performance.md 1.4).
    assert achieved_efficiency(hw, 128, 7168, 16384) < 0.4 * big
    assert achieved_efficiency(hw, 64, 7168, 16384) < 0.25 * big
    # K = 512 costs about half (1.4 (b)).
    assert achieved_efficiency(hw, 4096, 32768, 512) < 0.65 * big
    # Per-expert grouped GEMMs with 100-500 rows: 0.10-0.25 of peak (1.4 (c), 8).
    e = achieved_efficiency(hw, 128, 4096, 7168, batch=32, grouped=True)
    assert 0.08 < e < 0.3
    # Their weight gradient (K = rows) is worse still.
    w = achieved_efficiency(hw, 7168, 4096, 128, batch=32, grouped=True,
                            out_bytes=WGRAD_OUT_BYTES, source_bytes=WGRAD_SOURCE_BYTES)
    assert w < e


# SimuMax's in-framework B200 fit (achievable-performance.md 1.3; MooreThreads/SimuMax
# configs/system/b200_bf16_ceperm.json, 514 dense Transformer Engine shapes inside a
# Megatron run, M = 4096..128k tokens): weight gradients (NT layout, FP32 accumulation
# into main_grad) mostly at 0.41-0.57 of the 2250 TFLOP/s peak.
WGRAD_SHAPES = [(4096, 4096, 4096), (4096, 14336, 4096), (14336, 4096, 4096),
                (4096, 4096, 8192), (8192, 28672, 8192), (4096, 6144, 16384)]


@pytest.mark.parametrize("d_in,d_out,tokens", WGRAD_SHAPES)
def test_in_step_weight_gradients_match_the_in_framework_b200_fit(d_in, d_out, tokens):
    hw = hardware_preset("b200")
    w = achieved_efficiency(hw, d_in, d_out, tokens, in_step=True,
                            out_bytes=WGRAD_OUT_BYTES, source_bytes=WGRAD_SOURCE_BYTES)
    assert 0.41 <= w <= 0.57, w


def test_misaligned_width_costs_tens_of_percent():
    hw = hardware_preset("h100")
    # SwiGLU d_ff 10922 vs 10944 (achievable-performance.md 1.4): 46% slower measured.
    slow = gemm_time_s(hw, 8192, 10922, 4096, aligned=False)
    fast = gemm_time_s(hw, 8192, 10944, 4096)
    assert 1.2 < slow / fast < 1.6


# DeepGEMM FP8 on H800 (achievable-performance.md 1.4): M, N, K, measured TFLOP/s.
DEEPGEMM = [(64, 24576, 1536, 289), (64, 32768, 512, 219), (64, 7168, 16384, 336),
            (128, 24576, 1536, 535), (128, 7168, 16384, 645), (128, 4096, 7168, 533),
            (4096, 24576, 1536, 1212), (4096, 32768, 512, 775), (4096, 7168, 16384, 1520),
            (4096, 4096, 7168, 1410), (4096, 7168, 2048, 1168)]


@pytest.mark.parametrize("m,n,k,measured", DEEPGEMM)
def test_deepgemm_sweep_with_one_asymptote(m, n, k, measured):
    """With DeepGEMM's own asymptote (0.80 of FP8 peak) and streaming HBM efficiency, the
    epilogue + roofline model matches the K and M dependence of the measured table."""
    hw = replace(hardware_preset("h800"), fp8_gemm_efficiency=0.80, hbm_efficiency=0.85,
                 kernel_overhead_s=0.0)
    pred = 2 * m * n * k / gemm_time_s(hw, m, n, k, dtype="fp8") / 1e12
    assert pred == pytest.approx(measured, rel=0.08)


def test_fp8_faster_than_bf16_on_large_gemms():
    hw = hardware_preset("h100")
    assert gemm_time_s(hw, 8192, 8192, 8192, dtype="fp8") < \
        0.7 * gemm_time_s(hw, 8192, 8192, 8192, dtype="bf16")


def test_in_step_gemms_land_in_simumax_in_te_range():
    """Inside a training step a GEMM runs at gemm_in_step_ratio of its standalone rate:
    on B200 the layer GEMMs of Transformer Engine shapes land inside SimuMax's in-TE fit
    (achievable-performance.md 1.3: dense matmul 0.158-0.655 of 2250, median 0.485),
    while the same shape standalone stays near cuBLASLt's sweep (0.65-0.69)."""
    hw = hardware_preset("b200")
    for m, n, k in ((8192, 4096, 4096), (8192, 14336, 4096), (16384, 8192, 8192)):
        inside = achieved_efficiency(hw, m, n, k, in_step=True)
        alone = achieved_efficiency(hw, m, n, k)
        assert 0.41 < inside < 0.655, (m, n, k, inside)
        assert inside == pytest.approx(alone * hw.gemm_in_step_ratio, rel=0.05)
        assert 0.55 < alone < 0.70


def test_wave_quantisation_staircase():
    """One output tile over a full wave costs a second wave (achievable-performance.md 8:
    f_wave, the 1.0x-2.0x staircase of torch.mm over shape); below one wave the
    libraries split K and nothing is lost."""
    hw = replace(hardware_preset("h100"), kernel_overhead_s=0.0, gemm_fill_s=0.0)
    tm, tn, k = hw.gemm_tile, hw.gemm_tile_n, 8192
    assert hw.sm_count == 132 == 12 * 11
    full = gemm_time_s(hw, 12 * tm, 11 * tn, k)  # 132 tiles: exactly one wave
    over = gemm_time_s(hw, 12 * tm + 1, 11 * tn, k)  # 143 tiles: a second wave
    assert over / full == pytest.approx(2.0, rel=0.05)
    fewer = gemm_time_s(hw, 6 * tm, 11 * tn, k)  # 66 tiles: K split, no loss
    assert fewer / full == pytest.approx(0.5, rel=0.05)


def test_grouped_gemm_streams_leave_sms_idle_for_small_experts():
    """Qwen3-30B-A3B up projection on H100 in BF16, 128 experts x 512 rows, N 1536,
    K 2048: a sequential per-expert cuBLAS loop measured 112.3-129.5 TFLOP/s
    (tgale96/grouped_gemm PR #37, uniform to extreme skew). One stream: each expert's 24
    output tiles occupy 24 of 132 SMs. Transformer Engine runs four streams
    (multi_streams.h num_streams = 4): faster, still short of the full machine."""
    hw = hardware_preset("h100")
    shape = (512, 1536, 2048)
    peak = hw.bf16_tflops

    def tflops(streams):
        return achieved_efficiency(hw, *shape, batch=128, grouped=True,
                                   streams=streams) * peak

    one = tflops(1)
    assert 0.65 * 112.3 < one < 1.1 * 129.5
    assert one < tflops(4) < tflops(128)
    # Large experts fill the machine on any number of streams (no change).
    big = dict(batch=4, grouped=True)
    assert achieved_efficiency(hw, 8192, 4096, 7168, streams=1, **big) == \
        achieved_efficiency(hw, 8192, 4096, 7168, **big)
