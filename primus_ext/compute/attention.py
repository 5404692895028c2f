"""Core attention (softmax(QK^T) V) FLOPs, bytes and time: flash and unfused.

FLOPs follow the FlashAttention convention (achievable-performance.md, conventions):
forward ``2 * b * heads * s_q * keys * (d_qk + d_v)`` where ``keys`` is the mean number of
keys a query attends (``s/2`` causal, about ``w`` for a sliding window ``w``); the
backward recomputes QK^T and runs dV, dP, dQ, dK: ``2 * b * heads * s_q * keys *
(3 d_qk + 2 d_v)``, i.e. 2.5x the forward when ``d_qk == d_v``.

Flash attention efficiency (fraction of the BF16 peak) is a product of three saturations,
each a physical cause, times a forward or backward asymptote::

    eff = eta_dir * d/(d + d_half) * k/(k + k_half) * n/(n + n_half)

- ``d``: head dim (mean of QK and V dims): more MMA work per softmax element;
- ``k``: keys per query *within one kernel call* (with CP p2p each call sees one chunk):
  the per-tile prologue and softmax rescaling amortise over the key loop;
- ``n``: parallel work items, ``batch * heads * ceil(s_q / 128)`` query tiles: few heads
  per GPU after TP leave SMs idle (SimuMax B200: 64 heads 0.87 vs 8 heads 0.31).
Fitted to FA3/cuDNN H100 sweeps (2.1) with ``d_half=32, k_half=256, n_half=256``; the
hardware presets cite the rows their asymptotes come from. Attention runs in BF16 also
in FP8 runs. The memory roofline covers windowed layers, where keys are few.
``train.flash_attn_impl='fa2'`` (FlashAttention-2 where the hardware has a faster native
kernel) scales both asymptotes by ``hardware.flash2_attention_ratio`` (H100: FA2 333 vs
cuDNN 529 TFLOP/s causal hd128 forward at 8k, 318 vs 518 backward, 2.1: about 0.62);
``'fa1'`` (FlashAttention-1 class) by that times ``FLASH1_TO_FLASH2``.

The unfused path (megatron-core's local spec) is two batched GEMMs plus a
scale-mask-softmax and an optional dropout over the full ``s_q x s_k`` score matrix.
"""
from __future__ import annotations

from math import ceil

from primus_ext.compute.gemm import gemm_time_s
from primus_ext.spec.hardware import HardwareSpec

QUERY_TILE = 128
# FlashAttention-1 class kernels (flash-attn 1.x, and the Triton flash attention of
# llm-foundry's layers/flash_attn_triton.py, which its TUTORIAL.md @v0.3.0 calls "slightly
# faster than flash" = flash-attn 1.0.9) relative to FlashAttention-2 on the same GPU:
# Dao-AILab/flash-attention assets/flash2_a100_fwd_bwd_benchmark.png (FlashAttention-2
# release, A100, causal, head dim 128, forward + backward): FlashAttention 69/155,
# 76/173, 80/182, 83/189 TFLOP/s at 2k-16k (0.44; 62/133 = 0.47 at 1k), "FlashAttention
# Triton" 68-80 (0.42-0.44). Both run the sm80 mma.sync path on Hopper as FA2 does, so
# the ratio is applied to the FA2 rate there too.
FLASH1_TO_FLASH2 = 0.44


def mean_keys_per_query(seq: int, window: int | None) -> float:
    """Mean keys per query of a causal mask over ``seq`` tokens, optionally windowed.

    Causal: ``seq / 2`` (the FA convention). A window of ``w`` tokens: queries past
    position ``w`` see ``w`` keys, earlier ones see their prefix: ``w - w^2/(2 seq)``.
    """
    if window is None or window >= seq:
        return seq / 2.0
    return window - window * window / (2.0 * seq)


def attention_flops(batch: int, heads: int, s_q: float, keys: float, d_qk: int,
                    d_v: int) -> tuple[float, float]:
    """(forward, backward) FLOPs of core attention."""
    base = 2.0 * batch * heads * s_q * keys
    return base * (d_qk + d_v), base * (3 * d_qk + 2 * d_v)


def flash_efficiency(hw: HardwareSpec, *, backward: bool, head_dim: float,
                     call_keys: float, work_tiles: float, impl: str = "native") -> float:
    eta = hw.attention_bwd_efficiency if backward else hw.attention_efficiency
    if impl == "fa2":
        eta *= hw.flash2_attention_ratio
    elif impl == "fa1":
        eta *= hw.flash2_attention_ratio * FLASH1_TO_FLASH2
    eta *= head_dim / (head_dim + hw.attention_half_head_dim)
    eta *= call_keys / (call_keys + hw.attention_half_keys)
    eta *= work_tiles / (work_tiles + hw.attention_half_tiles)
    return eta


def flash_attention(hw: HardwareSpec, *, batch: int, heads: int, kv_heads: int,
                    s_q: float, s_kv: float, keys: float, call_keys: float, d_qk: int,
                    d_v: int, num_calls: int = 1, impl: str = "native"
                    ) -> tuple[float, float, float, float, float, float]:
    """(fwd_s, bwd_s, fwd_flops, bwd_flops, fwd_bytes, bwd_bytes) of flash attention.

    ``s_q`` queries (this rank), ``s_kv`` distinct keys read, ``keys`` mean keys per query
    over all calls, ``call_keys`` keys per query inside one kernel call, ``num_calls``
    kernel launches (CP ring steps).
    """
    f_fwd, f_bwd = attention_flops(batch, heads, s_q, keys, d_qk, d_v)
    if f_fwd <= 0:
        return 0.0, 0.0, 0.0, 0.0, 0.0, 0.0
    q = batch * s_q * heads * d_qk * 2
    kv = batch * s_kv * kv_heads * (d_qk + d_v) * 2
    o = batch * s_q * heads * d_v * 2
    lse = batch * s_q * heads * 4
    b_fwd = q + kv + o + lse
    b_bwd = 2 * (q + kv) + 3 * o + 2 * lse  # read q,k,v,o,dO,lse; write dq,dk,dv
    peak = hw.bf16_tflops * 1e12
    bw = hw.hbm_gbps * 1e9 * hw.hbm_efficiency
    d = 0.5 * (d_qk + d_v)
    tiles = batch * heads * ceil(s_q / QUERY_TILE)  # every call covers the local queries
    ck = max(min(call_keys, keys), 1.0)
    e_fwd = flash_efficiency(hw, backward=False, head_dim=d, call_keys=ck, work_tiles=tiles,
                             impl=impl)
    e_bwd = flash_efficiency(hw, backward=True, head_dim=d, call_keys=ck, work_tiles=tiles,
                             impl=impl)
    launch = hw.kernel_overhead_s + hw.gemm_fill_s
    t_fwd = max(f_fwd / (peak * e_fwd), b_fwd / bw) + num_calls * launch
    # The backward runs a preprocessing kernel (dO . O) besides the main kernel.
    t_bwd = max(f_bwd / (peak * e_bwd), b_bwd / bw) + num_calls * (launch + hw.kernel_overhead_s)
    return t_fwd, t_bwd, f_fwd, f_bwd, b_fwd, b_bwd


def unfused_attention(hw: HardwareSpec, *, batch: int, heads: int, s_q: float, s_k: float,
                      d_qk: int, d_v: int, dropout: bool, softmax_fp32: bool
                      ) -> tuple[float, float, float, float, float, float]:
    """(fwd_s, bwd_s, fwd_flops, bwd_flops, fwd_bytes, bwd_bytes) of megatron-core's
    unfused DotProductAttention: baddbmm QK^T, fused scale-mask-softmax, dropout, bmm PV.
    The full score matrix is computed (no causal saving)."""
    bh = batch * heads
    scores = bh * s_q * s_k
    t_qk = gemm_time_s(hw, s_q, s_k, d_qk, batch=bh)
    t_pv = gemm_time_s(hw, s_q, d_v, s_k, batch=bh)
    # dP = dO V^T, dV = P^T dO, dQ = dS K, dK = dS^T Q.
    t_bwd_gemm = (gemm_time_s(hw, s_q, s_k, d_v, batch=bh)
                  + gemm_time_s(hw, s_k, d_v, s_q, batch=bh)
                  + gemm_time_s(hw, s_q, d_qk, s_k, batch=bh)
                  + gemm_time_s(hw, s_k, d_qk, s_q, batch=bh))
    prob_bytes = 4 if softmax_fp32 else 2
    sm_fwd = scores * (2 + prob_bytes)  # read scores, write probabilities
    sm_bwd = scores * (2 * prob_bytes + 2)  # read probs and dP, write dS
    do_fwd = scores * (2 * prob_bytes + 1) if dropout else 0.0  # read, write, mask
    do_bwd = scores * (2 * prob_bytes + 1) if dropout else 0.0
    bw = hw.hbm_gbps * 1e9 * hw.hbm_efficiency
    kernels = 1 + int(dropout)
    t_fwd = t_qk + t_pv + (sm_fwd + do_fwd) / bw + kernels * hw.kernel_overhead_s
    t_bwd = t_bwd_gemm + (sm_bwd + do_bwd) / bw + kernels * hw.kernel_overhead_s
    f_fwd = 2.0 * bh * s_q * s_k * (d_qk + d_v)
    f_bwd = 2.0 * bh * s_q * s_k * (2 * d_qk + 2 * d_v)
    return t_fwd, t_bwd, f_fwd, f_bwd, sm_fwd + do_fwd, sm_bwd + do_bwd
