"""GEMM time on a HardwareSpec: a roofline whose epilogue is not hidden, on padded tiles.

For ``C[M,N] = A[M,K] @ B[K,N]`` (``batch`` independent problems of that shape)::

    t = max(F_pad / (peak * eff), (A + B bytes) / W) + C bytes / W + t_fill + t_launch

- ``F_pad = 2 * ceil(M/tile)*tile * ceil(N/tile)*tile * K``: output tiles are computed
  whole, so a GEMM with few rows (a per-expert GEMM with 100 tokens) pays for a full
  tile (tile quantisation). ``tile`` is ``hardware.gemm_tile``.
- Wave quantisation (``wave_time_s``): once the output tiles outnumber the SMs, the
  compute time is whole waves of ``sm_count`` tiles (``hardware.sm_count``,
  ``gemm_tile_n``).
- ``eff`` is the asymptotic efficiency of the dtype (``gemm_efficiency`` or
  ``fp8_gemm_efficiency``), times ``grouped_gemm_efficiency`` for grouped (MoE) kernels,
  times ``gemm_misaligned_efficiency`` when a weight dimension is not a multiple of 64
  (achievable-performance.md 1.4: 10922 vs 10944 costs 46%).
- A and B stream through the main loop, overlapped with the MMA; the output tile is
  written in the epilogue, after the K loop, so its bytes add to the time. With K small
  the epilogue dominates: this reproduces DeepGEMM's measured K=512 penalty (about 45%)
  and its K=1536..16384 points within 6% (achievable-performance.md 1.4) with one
  asymptotic efficiency, and the memory-bound regime of M=64/128-row GEMMs.
- An accumulating GEMM (``beta != 0``: the weight gradient added into Megatron's fp32
  ``main_grad``) also reads its source tile C. That read is issued by the producer warp
  with the main-loop loads, into its own shared-memory pipeline (CUTLASS
  ``epilogue/collective/sm90_epilogue_tma_warpspecialized.hpp``:
  ``CollectiveEpilogue::load`` runs on the producer load warp, ``LoadPipeline =
  PipelineTransactionAsync<StagesC>``; ``store`` reads C from shared memory), so its
  ``source_bytes`` stream with A and B and only the output write stays serial.
- Grouped (MoE) GEMMs run as Transformer Engine's per-expert loop of cuBLAS GEMMs over
  ``GROUPED_STREAMS`` = 4 CUDA streams (TE ``GroupedLinear`` -> ``general_grouped_gemm``
  -> ``nvte_multi_stream_cublas_gemm``; ``transformer_engine/common/include/
  transformer_engine/multi_streams.h`` ``num_streams = 4``): at most four experts' GEMMs
  run at once, so while four experts' output tiles are fewer than ``sm_count`` SMs sit
  idle (``grouped_stream_time_s``); K is not split across streams. A sequential
  per-expert cuBLAS loop (``streams=1``) measured 112-130 TFLOP/s on H100 for
  Qwen3-30B-A3B's up projection (128 experts x 512 rows, N 1536, K 2048;
  tgale96/grouped_gemm PR #37), 13% of the BF16 peak.
- ``in_step``: the GEMM runs inside a training step (every layer op does): the rate is
  further multiplied by ``gemm_in_step_ratio`` (sustained clocks, TE layouts and
  epilogues; 0.84 from SimuMax's in-TE B200 fit against MAMF, achievable-performance.md
  1.3). Standalone calls (microbenchmark comparisons) leave it out.
- ``W = hbm_gbps * hbm_efficiency``; ``t_fill = gemm_fill_s`` (pipeline fill and drain,
  about 5 us with the launch on B200 cuBLASLt, 1.2) and ``t_launch = kernel_overhead_s``,
  both per kernel (a grouped GEMM in Transformer Engine issues one GEMM per group).

Time is non-decreasing in M, N, K and non-increasing in every rate (for aligned
shapes), and the achieved efficiency ``2MNK / (t * peak)`` is in (0, eff].
"""
from __future__ import annotations

from math import ceil

from primus_ext.spec.hardware import HardwareSpec

ALIGN_ELEMS = 64  # achievable-performance.md 1.4 (d): dims not a multiple of 64 run slower
# Transformer Engine's grouped GEMM streams (multi_streams.h ``num_streams``).
GROUPED_STREAMS = 4
# Bytes per element of the GEMM inputs by compute dtype.
INPUT_BYTES = {"bf16": 2, "fp16": 2, "fp8": 1, "fp32": 4}
# The weight gradient accumulates into the fp32 main_grad (Megatron's
# gradient_accumulation_fusion): the tile is read (streamed, see the module docstring)
# and written back in fp32.
WGRAD_OUT_BYTES = 4
WGRAD_SOURCE_BYTES = 4


def peak_flops(hw: HardwareSpec, dtype: str) -> float:
    """Dense peak of a GEMM dtype in FLOP/s (FP8 falls back to BF16 where there is none)."""
    if dtype == "fp8" and hw.fp8_tflops:
        return hw.fp8_tflops * 1e12
    if dtype == "fp32":
        return (hw.fp32_tflops or hw.bf16_tflops / 2) * 1e12
    return hw.bf16_tflops * 1e12


def asymptotic_efficiency(hw: HardwareSpec, dtype: str) -> float:
    if dtype == "fp8" and hw.fp8_tflops:
        return hw.fp8_gemm_efficiency
    return hw.gemm_efficiency


def gemm_time_s(hw: HardwareSpec, m: float, n: float, k: float, *, dtype: str = "bf16",
                out_bytes: float = 2.0, batch: int = 1, grouped: bool = False,
                aligned: bool = True, in_step: bool = False,
                streams: int = GROUPED_STREAMS, source_bytes: float = 0.0,
                one_kernel: bool = False) -> float:
    """Seconds for ``batch`` GEMMs of shape M x N x K (one kernel, or one per group when
    ``grouped``, on ``streams`` CUDA streams). ``m`` may be fractional (expected rows per
    expert). ``source_bytes``: bytes per output element of an accumulation source C
    (0 for ``beta = 0``). ``one_kernel``: a grouped GEMM issued as one kernel over all
    groups (a true grouped kernel, e.g. Transformer Engine's CuTe DSL grouped MLP): every
    group's tiles share the machine (no stream limit) and one launch and fill are paid."""
    if one_kernel:
        streams = max(batch, 1)
    if m <= 0 or n <= 0 or k <= 0 or batch <= 0:
        return 0.0
    tile = hw.gemm_tile
    m_pad = ceil(m / tile) * tile
    n_pad = ceil(n / tile) * tile
    rate = peak_flops(hw, dtype) * asymptotic_efficiency(hw, dtype)
    if grouped:
        rate *= hw.grouped_gemm_efficiency
    if not aligned:
        rate *= hw.gemm_misaligned_efficiency
    if in_step:  # inside a training step (the layer ops), not a standalone benchmark
        rate *= hw.gemm_in_step_ratio
    in_bytes = INPUT_BYTES.get(dtype, 2)
    bw = hw.hbm_gbps * 1e9 * hw.hbm_efficiency
    t_compute = 2.0 * m_pad * n_pad * k * batch / rate
    if hw.sm_count:
        t_compute = max(t_compute, wave_time_s(hw, m, n, k, batch, rate))
        if grouped:
            t_compute = max(t_compute, grouped_stream_time_s(hw, m, n, k, batch, rate,
                                                             streams))
    t_stream = ((m * k + k * n) * in_bytes + m * n * source_bytes) * batch / bw
    t_epilogue = m * n * out_bytes * batch / bw
    kernels = batch if grouped and not one_kernel else 1
    return (max(t_compute, t_stream) + t_epilogue
            + kernels * (hw.gemm_fill_s + hw.kernel_overhead_s))


def wave_time_s(hw: HardwareSpec, m: float, n: float, k: float, batch: int,
                rate: float) -> float:
    """Compute time in whole waves (achievable-performance.md 8, f_wave): an output tile
    of ``gemm_tile x gemm_tile_n`` (128 x 256 on Hopper / Blackwell, 256 x 256 on
    MI300-class) runs on one SM at ``rate / sm_count``; a GEMM with more tiles than SMs
    takes ``ceil(tiles / sm_count)`` tile times, so one tile over a full wave costs a
    second wave. With fewer tiles than SMs the libraries split K over the idle SMs
    (DeepGEMM's 64- and 128-row GEMMs reach the memory bound, 1.4): no wave loss."""
    tm, tn = hw.gemm_tile, hw.gemm_tile_n
    tiles = ceil(m / tm) * ceil(n / tn) * batch
    if tiles <= hw.sm_count:
        return 0.0
    waves = ceil(tiles / hw.sm_count)
    return 2.0 * waves * hw.sm_count * tm * tn * k / rate


def grouped_stream_time_s(hw: HardwareSpec, m: float, n: float, k: float, groups: int,
                          rate: float, streams: int = GROUPED_STREAMS) -> float:
    """Compute time of ``groups`` equal GEMMs issued one per group on ``streams`` CUDA
    streams. Concurrent kernels share the SMs (the block scheduler fills an SM freed by
    one with another's tiles), so while ``min(streams, groups)`` GEMMs hold at least
    ``sm_count`` tiles the machine is full and the whole-machine wave time applies (0
    here). Below that (small experts), each round of concurrent GEMMs is one tile time on
    a partly idle machine."""
    tm, tn = hw.gemm_tile, hw.gemm_tile_n
    tiles = ceil(m / tm) * ceil(n / tn)
    conc = max(min(int(streams), groups), 1)
    if conc * tiles >= hw.sm_count:
        return 0.0
    rounds = ceil(groups / conc)
    return 2.0 * rounds * hw.sm_count * tm * tn * k / rate


def gemm_flops(m: float, n: float, k: float, batch: int = 1) -> float:
    return 2.0 * m * n * k * batch


def achieved_efficiency(hw: HardwareSpec, m: float, n: float, k: float, *,
                        dtype: str = "bf16", **kw) -> float:
    """Achieved fraction of the dtype's dense peak: ``2MNK / (t * peak)``."""
    t = gemm_time_s(hw, m, n, k, dtype=dtype, **kw)
    batch = kw.get("batch", 1)
    return gemm_flops(m, n, k, batch) / (t * peak_flops(hw, dtype)) if t > 0 else 0.0


def is_aligned(*dims: int) -> bool:
    return all(int(d) % ALIGN_ELEMS == 0 for d in dims)
