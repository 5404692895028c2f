"""HardwareSpec: datasheet figures and physical efficiency constants of one GPU kind.

Datasheet fields come from a cited source; the efficiency constants are physical
(a fraction of peak, a latency, a per-kernel overhead) and are fitted per hardware by
``primus-ext mode=calibrate`` from measured runs, never per model or per row.
"""
from __future__ import annotations

from dataclasses import dataclass

from primus_ext.spec._check import check_types, non_negative, positive

_OWNER = "hardware"


@dataclass(frozen=True, kw_only=True, slots=True)
class HardwareSpec:
    name: str
    vendor: str = ""
    source: str = ""
    # Dense peaks (no sparsity), TFLOP/s.
    bf16_tflops: float
    fp8_tflops: float | None = None
    fp32_tflops: float | None = None  # None -> bf16 / 2 (TF32 tensor cores)
    hbm_bytes: int
    hbm_gbps: float  # HBM bandwidth, GB/s (1e9)
    gpus_per_node: int = 8
    scale_up_domain_gpus: int = 8  # GPUs in one NVLink / Infinity Fabric domain
    scale_up_gbps: float  # per-GPU unidirectional scale-up bandwidth, GB/s
    scale_out_gbps: float  # per-GPU NIC bandwidth, GB/s (400 Gb/s -> 50)
    # Base latency of a small p2p transfer or collective launch inside the scale-up
    # domain / over the network (the per-step hop latencies are added on top).
    scale_up_latency_s: float = 3e-6
    scale_out_latency_s: float = 10e-6
    # FP8 GEMMs in every operand layout (TE transformer_engine/pytorch/utils.py
    # is_non_tn_fp8_gemm_supported: Blackwell); False (Hopper, Ada, AMD CDNA): TE keeps a
    # transposed copy of FP8 weights for dgrad (memory/te_states.py).
    fp8_non_tn_gemm: bool = False
    # Physical efficiency constants (defaults are priors; calibration refines them). The
    # models that use them are in primus_ext/compute/gemm.py, attention.py, kernels.py and
    # primus_ext/comm/collectives.py; per-hardware priors with their sources are in the
    # hydra_conf/hardware/*.yaml presets.
    # GEMM: t = max(F_padded / (peak * eff), A+B bytes / hbm) + C bytes / hbm + fill.
    gemm_efficiency: float = 0.80  # asymptotic BF16/FP16/TF32 GEMM fraction of dense peak
    fp8_gemm_efficiency: float = 0.70  # asymptotic FP8 GEMM fraction of the FP8 peak
    grouped_gemm_efficiency: float = 0.70  # grouped (MoE) kernel rate / dense kernel rate
    gemm_misaligned_efficiency: float = 0.70  # rate factor when a weight dim % 64 != 0
    # GEMM rate inside a training step over the standalone benchmark rate of the same
    # shape (sustained clocks under a whole step's power draw, Transformer Engine's layouts
    # and epilogues, FP32 wgrad accumulation): achievable-performance.md 1.3, SimuMax's
    # in-TE fit on 8x B200 reaches 0.655 of peak at its best dense shape against 0.776
    # standalone at the best shape (MAMF, 1.1): 0.84. The presets' gemm_efficiency
    # priors are standalone figures (MAMF, cuBLASLt sweeps); the layer ops apply this.
    gemm_in_step_ratio: float = 0.84
    gemm_tile: int = 128  # output tile edge: M and N are padded up to multiples of it
    # Wave quantisation (compute/gemm.py wave_time_s): an output tile of gemm_tile x
    # gemm_tile_n runs on one of sm_count SMs / CUs; 0 leaves waves out (the cpu preset).
    gemm_tile_n: int = 256
    sm_count: int = 0
    gemm_fill_s: float = 2.5e-6  # per-GEMM pipeline fill/drain on top of kernel_overhead_s
    # Attention: eff = attention_efficiency * d/(d+d_half) * k/(k+k_half) * n/(n+n_half).
    attention_efficiency: float = 0.55  # flash-attention forward asymptote (bf16 peak)
    attention_bwd_efficiency: float = 0.50  # flash-attention backward asymptote
    attention_half_head_dim: float = 32.0  # head dim at which the head-dim factor is 1/2
    attention_half_keys: float = 256.0  # keys per query (per kernel) at half efficiency
    attention_half_tiles: float = 256.0  # batch*heads*128-query tiles at half efficiency
    # FlashAttention-2 rate / native flash kernel rate on this GPU (train.flash_attn_impl):
    # 1 where FA2 is the native kernel (Ampere; CK on AMD), about 0.6 on Hopper.
    flash2_attention_ratio: float = 1.0
    # Memory-bound kernels.
    hbm_efficiency: float = 0.80  # achieved fraction of HBM bandwidth (fused elementwise)
    gather_hbm_efficiency: float = 0.50  # the same for gathers/scatters (MoE permute)
    kernel_overhead_s: float = 4e-6  # launch and tail per kernel
    # Collectives: busbw(S) = link * eff * max(ll_fraction, S / (S + half_bytes)); the
    # ll_fraction floor applies to the scale-up tier only (comm/collectives.py).
    scale_up_efficiency: float = 0.75  # ring all-reduce / all-gather bus bw / link bw
    scale_up_a2a_efficiency: float = 0.70  # all-to-all bus bw / link bw
    # The flex dispatcher's kernels inside the scale-up domain (comm/moe_comm.py): their
    # published algorithm bandwidth (every (token, rank) copy, the rank's own included)
    # over scale_up_gbps, DeepEP's normal kernels and HybridEP's, as (SMs, efficiency)
    # points at the SM counts measured (``flex_efficiency``); empty: the all-to-all's.
    deepep_efficiency_by_sms: tuple[tuple[float, ...], ...] = ()
    hybridep_efficiency_by_sms: tuple[tuple[float, ...], ...] = ()
    # The same kernels across scale-up domains: their published RDMA algorithm bandwidth
    # over scale_out_gbps, counted as DeepEP's and HybridEP's tests count it (a token once
    # per domain its experts fall in, its own domain included: it may pass 1), as
    # (domains, efficiency) points (``flex_network_efficiency``); empty: the network tier
    # carries the remote domains' copies at scale_out_efficiency.
    deepep_network_efficiency_by_domains: tuple[tuple[float, ...], ...] = ()
    hybridep_network_efficiency_by_domains: tuple[tuple[float, ...], ...] = ()
    scale_out_efficiency: float = 0.75  # achieved fraction of the per-GPU NIC bandwidth
    scale_up_half_bytes: float = 8e6  # message bytes at half of peak bus bw (scale-up)
    scale_out_half_bytes: float = 8e6  # the same on the NICs
    ll_bandwidth_fraction: float = 0.5  # low-latency protocol bw / peak (NCCL LL: 1/2)
    scale_up_hop_latency_s: float = 0.6e-6  # per ring step inside the domain
    scale_out_hop_latency_s: float = 2.7e-6  # per ring step over the network
    a2a_peer_latency_s: float = 0.5e-6  # per peer of an all-to-all
    # A ring that leaves the domain (comm/collectives.py cross_ring_s) runs, as NCCL's
    # tuner chooses, the fastest of three protocols, each with its own base latency, hop
    # latencies and bandwidth (NVIDIA/nccl src/graph/tuning.cc, v2.18-v2.21): LL at the
    # scale_*_hop_latency_s above; LL128 and Simple here.
    ring_base_ll_s: float = 6.6e-6
    ring_base_ll128_s: float = 14e-6
    ring_base_simple_s: float = 8.4e-6
    scale_up_hop_ll128_s: float = 1.9e-6
    scale_up_hop_simple_s: float = 3.4e-6
    scale_out_hop_ll128_s: float = 4.0e-6
    scale_out_hop_simple_s: float = 14e-6
    # Host cost of posting each ring step to the network proxy (a floor under every
    # in-domain hop of a multi-node ring; Simple pays it three times).
    net_step_overhead_s: float = 1.0e-6
    ll128_bandwidth_fraction: float = 0.92  # LL128 bus bw / Simple's (ppn >= 2)
    scale_out_ll_gbps: float = 20.4  # LL bus bw cap across the network (more than 2 nodes)
    scale_up_mesh: bool = False  # True: point-to-point links, no switch (AMD xGMI)
    comm_overlap_penalty: float = 0.10  # compute lost per second of overlapped comm (SMs)
    # Collectives a framework issues on a side stream without ``async_op`` overlap compute
    # only where the device has streams. A CPU has none (torch/cpu/__init__.py: Stream
    # "only exists to facilitate device-agnostic code"), so FSDP2's all-gathers and
    # reduce-scatters (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py
    # foreach_all_gather / foreach_reduce, issued with async_op=False on the all-gather /
    # reduce-scatter streams) block their rank until done: False exposes them whole.
    # Collectives issued with ``async_op=True`` (megatron-core's gradient buckets and TP
    # wgrad gathers, p2p) still run on the backend's own threads (gloo) and overlap.
    collective_streams: bool = True
    # Host clock (compute/host.py; ARCHITECTURE.md "two clocks"): the host issues every
    # kernel and collective in order and the device runs them in order, so a stretch of
    # short kernels is as long as the host takes to issue it. ``host_speed``: this GPU
    # node's CPU, single-thread, relative to the reference host on which the committed
    # host profile (primus_ext/data/host/reference.json) was measured (its Python,
    # dispatcher and autograd seconds divide by it). ``launch_s``: host time of one
    # kernel launch on top of that (cudaLaunchKernel and the CUDA caching allocator: no
    # CPU run has it). ``te_module_host_s``: the extra host time of one Transformer Engine
    # module call over the megatron-core local module it replaces (per forward and per
    # backward). ``collective_host_s``: host time of one collective call (c10d work
    # object, stream events, NCCL enqueue). ``sync_s``: one host-device synchronisation
    # (a scalar read back, cudaStreamSynchronize) on top of draining the device queue.
    # ``te_grouped_gemm_host_s``: the host time a Transformer Engine ``GroupedLinear``
    # call spends per expert GEMM beyond its launch: the per-split tensor views and
    # allocations, quantizer and cuBLAS descriptor setup of its C++ loop over the GEMMs
    # (TransformerEngine issue 1499: "the CPU overheads of PyTorch ops, such as
    # torch.split(), and torch.empty() (2x num_gemms calls)").
    # ``step_host_s``: Megatron-LM's training loop per iteration outside the model and
    # optimizer (scheduler, timers, logging, its own Python). ``host_clock`` False: the
    # device is the host (the cpu preset), there is no second clock.
    # Host link per GPU, GB/s each way (PCIe; NVLink-C2C on Grace): activation
    # offloading's device-to-host copies and their reloads.
    host_link_gbps: float = 55.0
    host_speed: float = 1.0
    launch_s: float = 5e-6
    te_module_host_s: float = 25e-6
    te_grouped_gemm_host_s: float = 10e-6
    collective_host_s: float = 20e-6
    sync_s: float = 20e-6
    step_host_s: float = 5e-3
    # Fraction of a rank's time lost to pauses that are not synchronised across ranks
    # (OS daemons and interrupts, the Python runtime, the NCCL proxy thread). A collective
    # over n ranks waits for any member's pause, so the per-layer collectives of FSDP make
    # the other n - 1 ranks' pauses everyone's (project/host_pauses.py; the mechanism:
    # Hoefler, Schneider, Lumsdaine, "Characterizing the Influence of System Noise on
    # Large-Scale Applications by Simulation", SC10). Prior 1e-4 (100 us a second: a few
    # scheduler ticks), fitted per preset by mode=calibrate where FSDP runs at scale exist.
    host_pause_fraction: float = 1e-4
    host_clock: bool = True
    tdp_w: float | None = None
    # GEMM workspaces held in PyTorch's caching allocator (memory/overhead.py), bytes:
    # PyTorch's cuBLAS workspace per (handle, stream) (aten/src/ATen/cuda/
    # CublasHandlePool.cpp parseChosenWorkspaceSize: 32 MiB on sm90, 8 MiB + 128 KiB on
    # other CUDA GPUs, 32 MiB on ROCm and 128 MiB on gfx94x/gfx95x; CUBLAS_WORKSPACE_CONFIG
    # ":4096:8" is 32 MiB too) and Transformer Engine's GEMM workspace (transformer_engine/
    # pytorch/cpp_extensions/gemm.py get_cublas_workspace_size_bytes: 32 MiB + 1 KiB at
    # compute capability >= 9, else 4 MiB). 0 on a CPU.
    cublas_workspace_bytes: int = 0
    te_workspace_bytes: int = 0
    # Presets of the same silicon at the same power (H100 / H200 / H800 SXM at 700 W) share
    # fitted efficiency constants: a preset without measured rows of its own takes those
    # of a fitted member of its family (project/fit.py). None: no sharing.
    calibration_family: str | None = None

    def __post_init__(self) -> None:
        check_types(self, _OWNER)
        for f in ("bf16_tflops", "hbm_gbps", "scale_up_gbps", "scale_out_gbps"):
            v = getattr(self, f)
            non_negative(_OWNER, f, v)
            if v == 0:
                raise ValueError(f"hardware.{f}={v} must be positive")
        positive(_OWNER, "hbm_bytes", self.hbm_bytes)
        positive(_OWNER, "gpus_per_node", self.gpus_per_node)
        positive(_OWNER, "scale_up_domain_gpus", self.scale_up_domain_gpus)
        for f in ("gemm_efficiency", "fp8_gemm_efficiency", "grouped_gemm_efficiency",
                  "gemm_misaligned_efficiency", "gemm_in_step_ratio", "attention_efficiency",
                  "attention_bwd_efficiency", "hbm_efficiency", "gather_hbm_efficiency",
                  "scale_up_efficiency", "scale_up_a2a_efficiency", "scale_out_efficiency",
                  "ll_bandwidth_fraction", "flash2_attention_ratio",
                  "ll128_bandwidth_fraction"):
            v = getattr(self, f)
            if not 0 < v <= 1:
                raise ValueError(f"hardware.{f}={v} must be in (0, 1]")
        for f in ("deepep_efficiency_by_sms", "hybridep_efficiency_by_sms"):
            object.__setattr__(self, f, _sm_points(f, getattr(self, f)))
        for f in ("deepep_network_efficiency_by_domains",
                  "hybridep_network_efficiency_by_domains"):
            object.__setattr__(self, f, _domain_points(f, getattr(self, f)))
        positive(_OWNER, "gemm_tile", self.gemm_tile)
        positive(_OWNER, "gemm_tile_n", self.gemm_tile_n)
        non_negative(_OWNER, "sm_count", self.sm_count)
        non_negative(_OWNER, "cublas_workspace_bytes", self.cublas_workspace_bytes)
        non_negative(_OWNER, "te_workspace_bytes", self.te_workspace_bytes)
        for f in ("attention_half_head_dim", "attention_half_keys", "attention_half_tiles",
                  "scale_up_half_bytes", "scale_out_half_bytes"):
            v = getattr(self, f)
            non_negative(_OWNER, f, v)
        for f in ("scale_up_latency_s", "scale_out_latency_s", "kernel_overhead_s",
                  "gemm_fill_s", "scale_up_hop_latency_s", "scale_out_hop_latency_s",
                  "a2a_peer_latency_s", "ring_base_ll_s", "ring_base_ll128_s",
                  "ring_base_simple_s", "scale_up_hop_ll128_s", "scale_up_hop_simple_s",
                  "scale_out_hop_ll128_s", "scale_out_hop_simple_s",
                  "net_step_overhead_s"):
            non_negative(_OWNER, f, getattr(self, f))
        non_negative(_OWNER, "scale_out_ll_gbps", self.scale_out_ll_gbps)
        if self.scale_out_ll_gbps == 0:
            raise ValueError(f"hardware.scale_out_ll_gbps={self.scale_out_ll_gbps} must be "
                             "positive")
        non_negative(_OWNER, "host_speed", self.host_speed)
        if self.host_speed == 0:
            raise ValueError(f"hardware.host_speed={self.host_speed} must be positive")
        for f in ("launch_s", "te_module_host_s", "te_grouped_gemm_host_s",
                  "collective_host_s", "sync_s",
                  "step_host_s", "host_link_gbps"):
            non_negative(_OWNER, f, getattr(self, f))
        if not 0 <= self.host_pause_fraction < 0.01:
            raise ValueError(f"hardware.host_pause_fraction={self.host_pause_fraction} "
                             "must be in [0, 0.01) (a fraction of each rank's time)")
        v = self.comm_overlap_penalty
        non_negative(_OWNER, "comm_overlap_penalty", v)
        if v > 1:
            raise ValueError(f"hardware.comm_overlap_penalty={v} must be at most 1")

    def flex_efficiency(self, backend: str, sms: int) -> float | None:
        """The flex dispatcher's efficiency over ``scale_up_gbps`` when its kernels run on
        ``sms`` SMs (``backend``: deepep | hybridep; None: no published figure). Between
        the published points linear; below the first, in proportion to the SMs (each SM
        moves its share of the tokens: DeepEP on B200 runs 0.36, 0.51 and 0.64 of NVLink
        at 16, 24 and 32 SMs); above the last, the last (the kernels saturate the links:
        0.66-0.68 from 36 to 48 SMs on B200)."""
        points = (self.hybridep_efficiency_by_sms if backend == "hybridep"
                  else self.deepep_efficiency_by_sms)
        if not points:
            return None
        if sms <= points[0][0]:
            return points[0][1] * sms / points[0][0]
        return _interpolate(points, sms)

    def flex_network_efficiency(self, backend: str, domains: int) -> float | None:
        """The flex dispatcher's network rate over ``scale_out_gbps`` when its EP group
        spans ``domains`` scale-up domains, in the kernels' own count (a token once per
        domain hit, its own included; None: no published figure). Linear between the
        published points, the nearest one outside them."""
        points = (self.hybridep_network_efficiency_by_domains if backend == "hybridep"
                  else self.deepep_network_efficiency_by_domains)
        if not points:
            return None
        return points[0][1] if domains <= points[0][0] else _interpolate(points, domains)

    def peak_tflops(self, precision: str) -> float:
        """Dense peak for a run's precision (fp8 falls back to bf16 where there is none)."""
        if precision == "fp8" and self.fp8_tflops:
            return self.fp8_tflops
        if precision == "fp32":
            return self.fp32_tflops or self.bf16_tflops / 2
        return self.bf16_tflops


def _interpolate(points, x: float) -> float:
    """Linear between (x, y) points (x rising, x at or past the first), the last y past
    the last."""
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return points[-1][1]


def _domain_points(name: str, points) -> tuple[tuple[float, float], ...]:
    """(domains, efficiency) points as tuples, domains rising from 2, efficiencies in
    (0, 2] (the kernels' count includes the token's own domain, so at two domains up to
    twice the NIC's rate)."""
    return _points(name, points, "domains", "domain counts", "domains >= 2",
                   lambda d: d >= 2, 2)


def _sm_points(name: str, points) -> tuple[tuple[float, float], ...]:
    """(SMs, efficiency) points as tuples, SMs rising, efficiencies in (0, 1]."""
    return _points(name, points, "SMs", "SM counts", "SMs > 0", lambda n: n > 0, 1)


def _points(name: str, points, unit: str, counts: str, rule: str, valid, eff_max: float
            ) -> tuple[tuple[float, float], ...]:
    """[x, efficiency] pairs as tuples, x valid and rising, efficiencies in (0, eff_max]."""
    out = []
    for p in points:
        if len(p) != 2:
            raise ValueError(f"hardware.{name}={points!r} must be a list of [{unit}, "
                             "efficiency] pairs")
        x, eff = p
        if not valid(x) or not 0 < eff <= eff_max:
            raise ValueError(f"hardware.{name}={points!r}: each pair needs {rule} and an "
                             f"efficiency in (0, {eff_max}]")
        if out and x <= out[-1][0]:
            raise ValueError(f"hardware.{name}={points!r}: {counts} must rise")
        out.append((x, eff))
    return tuple(out)
