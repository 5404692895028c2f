"""Per-rank shapes of a run and the cost of one op: forward, dgrad, wgrad.

An op is a GEMM (a linear layer: three GEMMs), a core attention, or a memory-bound
kernel. Every op carries a ``module`` tag naming the megatron-core module it belongs to,
so selective recompute (``train.recompute_modules``) can pick the ops it re-runs.
Seconds are per microbatch on one rank.
"""
from __future__ import annotations

from dataclasses import dataclass

from primus_ext.compute.gemm import (GROUPED_STREAMS, WGRAD_OUT_BYTES, WGRAD_SOURCE_BYTES,
                                      gemm_time_s, is_aligned)
from primus_ext.spec.run import RunSpec, uses_te


@dataclass(frozen=True, slots=True)
class OpCost:
    name: str
    module: str
    fwd_s: float
    dgrad_s: float  # backward w.r.t. inputs (and any non-GEMM backward)
    wgrad_s: float  # backward w.r.t. weights
    fwd_flops: float = 0.0
    dgrad_flops: float = 0.0
    wgrad_flops: float = 0.0
    fwd_bytes: float = 0.0
    bwd_bytes: float = 0.0
    # Kernels the op launches on a GPU (the host clock's launch count, compute/host.py):
    # a GEMM's forward is one, its backward two (dgrad, wgrad); a memory-bound op as
    # many as its kernel chain.
    fwd_kernels: int = 1
    bwd_kernels: int = 2

    @property
    def bwd_flops(self) -> float:
        return self.dgrad_flops + self.wgrad_flops


class Shapes:
    """Per-rank sizes of one run (one microbatch), derived once per spec.

    ``tokens``: tokens a rank's GEMMs see, ``b * s / cp``; ``sp_tokens``: tokens of the
    sequence-parallel regions (norms, residuals, router), ``tokens / tp`` with SP.
    """
    __slots__ = ("hw", "model", "par", "train", "batch", "seq", "tokens", "sp_tokens", "tp",
                 "cp", "ep", "etp", "heads", "groups", "head_dim", "gemm_dtype",
                 "act_bytes", "bw", "gather_bw", "overhead", "hidden", "te")

    def __init__(self, spec: RunSpec) -> None:
        m, p, t = spec.model, spec.parallel, spec.train
        self.hw = spec.cluster.hardware
        self.model, self.par, self.train = m, p, t
        self.batch = t.micro_batch_size
        self.seq = t.seq_length
        self.tp, self.cp, self.ep, self.etp = p.tp, p.cp, p.ep, p.expert_tp
        self.tokens = self.batch * self.seq // p.cp
        self.sp_tokens = self.tokens // p.tp if p.sequence_parallel else self.tokens
        self.hidden = m.hidden_size
        self.heads = m.num_attention_heads // p.tp
        self.groups = max(m.num_groups // p.tp, 1)
        self.head_dim = m.head_dim
        self.gemm_dtype = {"fp8": "fp8", "fp32": "fp32", "fp16": "fp16"}.get(t.precision,
                                                                            "bf16")
        self.act_bytes = 4 if t.precision == "fp32" else 2
        hw = self.hw
        self.bw = hw.hbm_gbps * 1e9 * hw.hbm_efficiency
        self.gather_bw = hw.hbm_gbps * 1e9 * hw.gather_hbm_efficiency
        self.overhead = hw.kernel_overhead_s
        self.te = uses_te(spec)  # Transformer Engine layers (spec.run.uses_te)


def fp8_cast(recipe: str) -> tuple[float, int]:
    """(bytes per element, kernels) of quantising one BF16 GEMM operand: read it, write
    row- and column-wise FP8 copies (4 B). Current scaling (``tensorwise``; TE
    ``Float8CurrentScalingQuantizer::quantize``, csrc/quantizer.cpp) first reads the tensor
    for its amax (``nvte_compute_amax``), then derives the scale
    (``nvte_compute_scale_from_amax``) and casts (``nvte_quantize_v2``): one more read
    (2 B) and two more kernels. Delayed scaling casts with last step's scale; block and
    MX scaling compute their scales inside the cast."""
    if recipe == "tensorwise":
        return 6.0, 3
    return 4.0, 1


def grouped_cast_kernels(recipe: str, groups: int, one_kernel: bool = False) -> int:
    """Kernels that quantise one operand of a grouped GEMM over ``groups`` experts.

    Transformer Engine's GroupedLinear quantises its input and its output gradient per
    expert (``tex.split_quantize`` with one quantizer per GEMM; TE v2.8-v2.12
    pytorch/csrc/extensions/cast.cpp ``multi_tensor_quantize_impl``): only when every
    quantizer is a delayed-scaling ``Float8Quantizer`` does one fused kernel
    (``nvte_multi_cast_transpose``) cast all groups; current scaling and MXFP8 / block
    scaling call ``quantizer->quantize`` once per expert, current scaling's three kernels
    each (amax, scale, cast; ``Float8CurrentScalingQuantizer::quantize_impl``). A true
    grouped kernel (``one_kernel``) quantises in a fused producer or one grouped call."""
    kernels = fp8_cast(recipe)[1]
    if groups > 1 and not one_kernel and recipe != "delayed":
        return kernels * groups
    return kernels


def linear(sh: Shapes, name: str, module: str, tokens: float, d_in: int, d_out: int, *,
           dtype: str | None = None, groups: int = 1, streams: int = GROUPED_STREAMS,
           one_kernel: bool = False, cast_input: bool = True,
           cast_grad: bool = True) -> OpCost:
    """A linear layer ``[tokens, d_in] @ [d_in, d_out]`` as three GEMMs.

    ``groups > 1``: a grouped GEMM over ``groups`` local experts with ``tokens`` rows each,
    on ``streams`` CUDA streams (one: a per-expert loop), or as ``one_kernel``
    (compute/gemm.py). FP8 GEMMs add the quantisation casts of their inputs as
    memory-bound kernels: the activation in forward and the output gradient in backward,
    each quantised as ``fp8_cast`` says for the run's recipe, per expert in a grouped
    GEMM (``grouped_cast_kernels``; the weights' FP8
    copies are cached across microbatches by Transformer Engine and not counted);
    ``cast_input`` / ``cast_grad`` False: a fused producer writes them quantised.

    The weight gradient accumulates into the fp32 ``main_grad`` inside the GEMM with
    ``train.gradient_accumulation_fusion`` (compute/gemm.py). Without it the GEMM writes
    a ``.grad`` in the activation dtype and megatron-core's DDP backward hook adds it
    (``distributed_data_parallel.py`` ``_make_backward_post_hook``:
    ``param.main_grad.add_(param.grad.data)``): one elementwise kernel per weight (per
    expert: TE GroupedLinear holds one weight per expert) that reads the gradient and
    ``main_grad`` and writes ``main_grad`` back, every microbatch.
    """
    hw = sh.hw
    dtype = dtype or sh.gemm_dtype
    grouped = groups > 1
    aligned = is_aligned(d_in, d_out)
    kw = dict(dtype=dtype, batch=groups, grouped=grouped, aligned=aligned, in_step=True,
              streams=streams, one_kernel=one_kernel)
    t_f = gemm_time_s(hw, tokens, d_out, d_in, **kw)
    t_d = gemm_time_s(hw, tokens, d_in, d_out, **kw)
    fused_acc = sh.train.gradient_accumulation_fusion
    t_w = gemm_time_s(hw, d_in, d_out, tokens,
                      out_bytes=WGRAD_OUT_BYTES if fused_acc else sh.act_bytes,
                      source_bytes=WGRAD_SOURCE_BYTES if fused_acc else 0.0, **kw)
    # Unfused accumulation, main_grad.add_(grad): read both, write main_grad.
    acc_bytes = 0.0 if fused_acc else d_in * d_out * groups * (sh.act_bytes
                                                                + 2 * WGRAD_OUT_BYTES)
    t_w += acc_bytes / sh.bw + (0 if fused_acc else groups * sh.overhead)
    flops = 2.0 * tokens * d_in * d_out * groups
    in_b = 1 if dtype == "fp8" else (4 if dtype == "fp32" else 2)
    b_f = (tokens * d_in + tokens * d_out) * groups * in_b + d_in * d_out * groups * in_b
    b_b = 2 * b_f
    # One GEMM per group (TE GroupedLinear: one cuBLAS call per local expert).
    k_f, k_b = (1, 2) if one_kernel else (groups, 2 * groups)
    if not fused_acc:
        k_b += groups
        b_b += acc_bytes
    if dtype == "fp8":
        per = fp8_cast(sh.train.fp8_recipe)[0]
        kernels = grouped_cast_kernels(sh.train.fp8_recipe, groups, one_kernel)
        if cast_input:
            cast_f = tokens * d_in * groups * per
            t_f += cast_f / sh.bw + kernels * sh.overhead
            b_f += cast_f
            k_f += kernels
        if cast_grad:
            cast_b = tokens * d_out * groups * per
            t_d += cast_b / sh.bw + kernels * sh.overhead
            b_b += cast_b
            k_b += kernels
    return OpCost(name, module, t_f, t_d, t_w, flops, flops, flops, b_f, b_b, k_f, k_b)


def memory_op(sh: Shapes, name: str, module: str, fwd_bytes: float, bwd_bytes: float, *,
              fwd_kernels: int = 1, bwd_kernels: int = 1, gather: bool = False,
              bwd_is_wgrad: bool = False) -> OpCost:
    """A memory-bound kernel (elementwise, norm, permute): bytes / achieved HBM bw."""
    bw = sh.gather_bw if gather else sh.bw
    t_f = fwd_bytes / bw + fwd_kernels * sh.overhead if fwd_bytes > 0 else 0.0
    t_b = bwd_bytes / bw + bwd_kernels * sh.overhead if bwd_bytes > 0 else 0.0
    k = dict(fwd_bytes=fwd_bytes, bwd_bytes=bwd_bytes,
             fwd_kernels=fwd_kernels if fwd_bytes > 0 else 0,
             bwd_kernels=bwd_kernels if bwd_bytes > 0 else 0)
    if bwd_is_wgrad:
        return OpCost(name, module, t_f, 0.0, t_b, **k)
    return OpCost(name, module, t_f, t_b, 0.0, **k)


def norm(sh: Shapes, name: str, tokens: float, width: int, module: str = "layernorm"
         ) -> OpCost:
    """RMSNorm / LayerNorm: forward reads x, writes y; backward reads x and dy, writes dx
    (the weight-gradient reduction is small and fused).

    Eager RMSNorm (``train.fused_elementwise=False``; torch's composite ``nn.RMSNorm``):
    x.float() (read 2, write 4 B per element), pow (4, 4), mean (4), x * rsqrt (4, 4),
    type_as (4, 2), * weight (2, 2): 36 B in 6 kernels; autograd's backward of that chain
    moves about 60 B in 9 kernels. LayerNorm is one aten kernel, eager or not."""
    n = tokens * width
    if not sh.train.fused_elementwise and sh.model.normalization == "RMSNorm":
        return memory_op(sh, name, module, 36 * n, 60 * n, fwd_kernels=6, bwd_kernels=9)
    e = n * sh.act_bytes
    return memory_op(sh, name, module, 2 * e, 3 * e)


def bias_dropout_add(sh: Shapes, name: str, tokens: float, module: str = "bda") -> OpCost:
    """megatron-core's fused bias-dropout-add: read x and the residual, write the sum
    (plus a one-byte mask with dropout); backward reads dy (and the mask), writes dx."""
    e = tokens * sh.hidden * sh.act_bytes
    dropout = sh.model.hidden_dropout > 0
    mask = tokens * sh.hidden if dropout else 0.0
    return memory_op(sh, name, module, 3 * e + mask, 2 * e + mask)


def gated_activation(sh: Shapes, name: str, module: str, rows: float, width: float
                     ) -> OpCost:
    """SwiGLU (reads 2 halves, writes 1; backward reads 2 + dy, writes 2) or a plain
    activation (reads and writes one; backward reads x and dy, writes dx). Eager SwiGLU
    (``silu(a) * b``, ``train.fused_elementwise=False``) writes silu(a) and reads it back:
    5 element-passes forward in 2 kernels, 8 backward in 3. A clamped gated unit adds
    its clamp kernels (``clamp_passes``)."""
    e = rows * width * sh.act_bytes
    if sh.model.gated:
        cf, cb, kf, kb = clamp_passes(sh)
        if not sh.train.fused_elementwise:
            return memory_op(sh, name, module, (5 + cf) * e, (8 + cb) * e,
                             fwd_kernels=2 + kf, bwd_kernels=3 + kb)
        return memory_op(sh, name, module, (3 + cf) * e, (5 + cb) * e,
                         fwd_kernels=1 + kf, bwd_kernels=1 + kb)
    return memory_op(sh, name, module, 2 * e, 3 * e)


def clamp_passes(sh: Shapes) -> tuple[int, int, int, int]:
    """Element-passes (in units of one half of the gated unit's input) and kernels, forward
    and backward, that ``--activation-func-clamp-value`` adds; aten's own counts of
    megatron-core's code (tests/compute/test_elementwise_bytes.py).

    Fused (megatron-core fused_bias_geglu.weighted_bias_quick_geglu_impl, the quick-GeGLU
    path): ``x_glu.clamp(max=c)`` and ``x_linear.clamp(-c, c)`` (read 1, write 1 each) and
    ``torch.cat`` of the halves (read 2, write 2) before the fused kernel: 8 in 3 kernels.
    Backward: clamp's gradient is ``where(mask, dy, 0)`` with its mask built from x (one
    side: le, where = 4; two sides: ge, le, logical_and, where = 7, the bool masks at half
    a pass), and the chunk's gradient is a cat (4): 15 in 7 kernels. The fused SwiGLU
    (``bias_swiglu_impl``) takes no clamp value: megatron-core runs it unclamped.
    Eager (``fused_elementwise=False``): the two clamps and their gradients without the
    cat, 4 in 2 kernels forward and 11 in 6 backward."""
    m = sh.model
    if m.activation_func_clamp_value is None or not m.gated:
        return 0, 0, 0, 0
    if sh.train.fused_elementwise:
        if m.activation != "quick_geglu":
            return 0, 0, 0, 0
        return 8, 15, 3, 7
    return 4, 11, 2, 6


def sum_ops(ops) -> tuple[float, float, float, float, float]:
    """(fwd_s, dgrad_s, wgrad_s, fwd_flops, bwd_flops) of a list of ops."""
    f = d = w = ff = bf = 0.0
    for o in ops:
        f += o.fwd_s
        d += o.dgrad_s
        w += o.wgrad_s
        ff += o.fwd_flops
        bf += o.dgrad_flops + o.wgrad_flops
    return f, d, w, ff, bf
