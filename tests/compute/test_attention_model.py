"""Core attention: FLOP conventions, windows, and the FA3/cuDNN sweeps of the priors."""
from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from primus_ext.compute.attention import attention_flops, flash_attention, \
    mean_keys_per_query, unfused_attention
from primus_ext.presets import hardware_preset


def test_flops_follow_the_flash_attention_convention():
    fwd, bwd = attention_flops(2, 16, 4096, 4096 / 2, 128, 128)
    # forward 4 b s^2 h d halved for causal, backward 2.5x forward.
    assert fwd == 4 * 2 * 4096 ** 2 * 16 * 128 / 2
    assert bwd == pytest.approx(2.5 * fwd)


def test_window_keys():
    assert mean_keys_per_query(4096, None) == 2048
    assert mean_keys_per_query(4096, 8192) == 2048
    w = mean_keys_per_query(4096, 128)
    assert 120 < w < 128
    # continuous at w = s
    assert mean_keys_per_query(4096, 4096) == pytest.approx(4096 - 4096 / 2)


def _fa(hw, s, heads=16, d=128, batch=None, causal=True):
    batch = batch or max(1, 16384 // s)  # the FA3 benchmark: 16k tokens
    keys = s / 2 if causal else s
    t_f, t_b, f_f, f_b, _, _ = flash_attention(hw, batch=batch, heads=heads, kv_heads=heads,
                                               s_q=s, s_kv=s, keys=keys, call_keys=keys,
                                               d_qk=d, d_v=d)
    return f_f / t_f / 1e12, f_b / t_b / 1e12


# cuDNN on H100, hd128 (achievable-performance.md 2.1): the backend TE uses on Hopper.
@pytest.mark.parametrize("s,fwd_causal,bwd_noncausal", [(1024, 410, 408), (2048, 484, 465),
                                                        (4096, 518, 499), (8192, 529, 518),
                                                        (16384, 539, 516)])
def test_h100_prior_tracks_cudnn_sweep(s, fwd_causal, bwd_noncausal):
    hw = hardware_preset("h100")
    f, _ = _fa(hw, s)
    _, b = _fa(hw, s, causal=False)
    assert f == pytest.approx(fwd_causal, rel=0.2)
    assert b == pytest.approx(bwd_noncausal, rel=0.2)


def test_efficiency_rises_with_sequence_and_heads():
    hw = hardware_preset("h100")
    assert _fa(hw, 512)[0] < _fa(hw, 4096)[0] < _fa(hw, 16384)[0]
    few = _fa(hw, 4096, heads=8, batch=1)[0]
    many = _fa(hw, 4096, heads=64, batch=1)[0]
    assert few < 0.8 * many


@settings(max_examples=100, deadline=None)
@given(st.integers(7, 15).map(lambda x: 2 ** x), st.sampled_from([64, 128, 192]),
       st.floats(1.0, 3.0), st.sampled_from(["hbm_gbps", "bf16_tflops"]))
def test_faster_hardware_never_slower(s, d, factor, field):
    hw = hardware_preset("b200")
    fast = replace(hw, **{field: getattr(hw, field) * factor})
    a = _fa(hw, s, d=d)
    b = _fa(fast, s, d=d)
    assert b[0] >= a[0] * 0.999 and b[1] >= a[1] * 0.999


def test_unfused_counts_the_full_score_matrix():
    hw = hardware_preset("h100")
    t_f, t_b, f_f, f_b, _, _ = unfused_attention(hw, batch=1, heads=16, s_q=2048, s_k=2048,
                                                 d_qk=128, d_v=128, dropout=True,
                                                 softmax_fp32=True)
    assert f_f == 4 * 2048 ** 2 * 16 * 128
    assert f_b == 2 * f_f
    flash = flash_attention(hw, batch=1, heads=16, kv_heads=16, s_q=2048, s_kv=2048,
                            keys=1024, call_keys=1024, d_qk=128, d_v=128)
    assert t_f > flash[0]


# FlashAttention-2 release chart (Dao-AILab/flash-attention
# assets/flash2_a100_fwd_bwd_benchmark.png): A100, causal, head dim 128, 16k tokens,
# forward + backward TFLOP/s of FlashAttention-2 and of FlashAttention (v1).
@pytest.mark.parametrize("s,fa2,fa1", [(2048, 155, 69), (4096, 173, 76), (8192, 182, 80),
                                       (16384, 189, 83)])
def test_a100_fa1_and_fa2_priors_track_the_flash2_release_chart(s, fa2, fa1):
    hw = hardware_preset("a100")
    rates = {}
    for impl in ("fa2", "fa1"):
        t_f, t_b, f_f, f_b, _, _ = flash_attention(
            hw, batch=16384 // s, heads=16, kv_heads=16, s_q=s, s_kv=s, keys=s / 2,
            call_keys=s / 2, d_qk=128, d_v=128, impl=impl)
        rates[impl] = (f_f + f_b) / (t_f + t_b) / 1e12
    assert rates["fa2"] == pytest.approx(fa2, rel=0.05)
    assert rates["fa1"] == pytest.approx(fa1, rel=0.05)
