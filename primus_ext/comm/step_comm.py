"""Collectives outside the layers: pipeline p2p, data-parallel gradient sync, parameter
all-gather of the distributed optimizer, and the overlap rule the step composer applies.

- **PP p2p**: one activation (or its gradient) between adjacent stages per microbatch,
  ``b * s/cp * h`` elements, divided by TP under SP (the hidden states are sharded along
  the sequence there). The stage boundary that leaves a scale-up domain sets the time
  (the slowest link of the pipeline; with interleaving the last-to-first wrap link too).
- **DP gradient sync**: dense gradients over the data x context group, expert gradients
  over the expert-data group, in fp32 for BF16/FP8 runs (Megatron-LM turns on
  ``accumulate_allreduce_grads_in_fp32`` with ``--bf16``) unless
  ``parallel.grad_reduce_in_fp32`` is off (bf16 on the wire), in buckets of
  ``parallel.ddp_bucket_params`` parameters (default ``max(40M, 1M * dp)``, megatron-core
  DistributedDataParallelConfig) when ``overlap_grad_reduce`` and the caller asks for
  bucketing (``bucketed=False``: one bucket, as megatron-core gives every model chunk
  but the first one of the first pipeline stage); reduce-scatter with the
  distributed optimizer, all-reduce without. FSDP reduces per layer (in the layer comms)
  and returns zero here.
- **Parameter all-gather** (distributed optimizer): the updated BF16 parameters, bucketed
  the same way.
- **Overlap rule** (``exposed_dp_s``): with ``overlap_grad_reduce`` the buckets are reduced
  while the last microbatch's backward runs, so the sync hides behind that backward up
  to its length, but the last bucket (issued after the backward ends) is always exposed;
  likewise ``overlap_param_gather`` hides the gather behind the first microbatch's
  forward except the first bucket. Without the switch, all of it is exposed.
"""
from __future__ import annotations

from dataclasses import dataclass
from math import ceil

from primus_ext.comm.collectives import all_gather_s, all_reduce_s, p2p_s, reduce_scatter_s
from primus_ext.comm.groups import domain_size, group_span, pp_boundary_crosses_domain
from primus_ext.comm.overlap import exposed_s
from primus_ext.spec.run import RunSpec

DEFAULT_BUCKET_PARAMS = 40_000_000


@dataclass(frozen=True, slots=True)
class SyncCost:
    """One step's gradient sync (or parameter gather) on one rank."""
    total_s: float  # all buckets, back to back on the communication stream
    first_bucket_s: float  # the bucket that cannot overlap (last reduced / first gathered)
    num_buckets: int
    num_bytes: float


def p2p_bytes(spec: RunSpec) -> float:
    p, t = spec.parallel, spec.train
    act = 4 if t.precision == "fp32" else 2
    n = t.micro_batch_size * t.seq_length // p.cp * spec.model.hidden_size * act
    return n / p.tp if p.sequence_parallel else n


def p2p_boundary_times_s(spec: RunSpec) -> tuple[float, ...]:
    """Seconds of one activation send across each stage boundary (stage i -> i+1)."""
    hw = spec.cluster.hardware
    nbytes = p2p_bytes(spec)
    dom = domain_size(spec.cluster)
    return tuple(p2p_s(hw, nbytes, cross_domain=c, domain_size=dom)
                 for c in pp_boundary_crosses_domain(spec))


def p2p_time_s(spec: RunSpec) -> float:
    """One activation send between adjacent stages: the slowest boundary (0 if pp == 1)."""
    if spec.parallel.pp == 1:
        return 0.0
    times = p2p_boundary_times_s(spec)
    if spec.parallel.vpp > 1:
        span = group_span(spec, "pp")
        hw = spec.cluster.hardware
        times += (p2p_s(hw, p2p_bytes(spec), cross_domain=not span.intra_domain,
                        domain_size=span.domain_size),)
    return max(times)


def grad_bytes_per_param(spec: RunSpec) -> int:
    """Bytes per gradient element on the wire: fp32 unless the run reduces in 16 bits
    (fp16 runs, or ``grad_reduce_in_fp32=False``: megatron-core's bf16 grad buffer, FSDP
    ``reduce_dtype=bf16``); fp32 runs always reduce in fp32."""
    t = spec.train
    if t.precision == "fp32":
        return 4
    if t.precision == "fp16" or not spec.parallel.grad_reduce_in_fp32:
        return 2
    return 4


def gathered_param_bytes(spec: RunSpec) -> int:
    """Bytes per parameter in the distributed optimizer's all-gather: the FP8 storage
    with ``--fp8-param-gather`` (megatron-core ``distributed_data_parallel.py``: a
    Float8Tensor's buffer is ``torch.uint8``), except MXFP8, whose parameters are
    gathered in bf16 through the grad buffer (``param_and_grad_buffer.py``
    ``reuse_grad_buf_for_mxfp8_param_ag``, the shared buffer); else the compute dtype."""
    t = spec.train
    if t.precision == "fp8" and t.fp8_param_gather and t.fp8_recipe != "mxfp8":
        return 1
    return t.param_bytes


def bucket_params(spec: RunSpec) -> int:
    """Parameters per DDP bucket: ``parallel.ddp_bucket_params``, else megatron-core's
    default ``max(40M, 1M * dp)`` with dp the data-parallel size without context
    parallelism, for dense and expert buffers alike (DistributedDataParallel.__init__:
    ``parallel_state.get_data_parallel_world_size()``)."""
    given = spec.parallel.ddp_bucket_params
    return given if given is not None else max(DEFAULT_BUCKET_PARAMS, 1_000_000 * spec.dp)


def _bucketed(spec: RunSpec, axis: str, num_params: float, bytes_per: int,
              collective, bucketed: bool = True) -> SyncCost:
    span = group_span(spec, axis)
    if num_params <= 0 or span.size == 1:
        return SyncCost(0.0, 0.0, 0, 0.0)
    hw = spec.cluster.hardware
    par = spec.parallel
    if par.overlap_grad_reduce and bucketed:
        n = max(1, ceil(num_params / bucket_params(spec)))
    else:
        n = 1
    per = num_params / n
    one = collective(hw, span, per * bytes_per)
    return SyncCost(total_s=n * one, first_bucket_s=one, num_buckets=n,
                    num_bytes=num_params * bytes_per)


def _add(a: SyncCost, b: SyncCost) -> SyncCost:
    return SyncCost(a.total_s + b.total_s, max(a.first_bucket_s, b.first_bucket_s),
                    a.num_buckets + b.num_buckets, a.num_bytes + b.num_bytes)


def _counts(num_dense_params, num_expert_params: float) -> tuple[float, float]:
    """Accept ``(dense, expert)`` as returned by ``stage_param_counts`` in place of two
    numbers."""
    if isinstance(num_dense_params, tuple):
        return num_dense_params
    return num_dense_params, num_expert_params


def dp_grad_sync(spec: RunSpec, num_dense_params, num_expert_params: float = 0.0, *,
                 bucketed: bool = True) -> SyncCost:
    """Gradient reduction of one rank's parameters (a pipeline stage's), per step.

    ``num_dense_params`` may be the ``(dense, expert)`` pair of
    ``compute.rank_params.stage_param_counts``; ``bucketed=False``: one bucket."""
    num_dense_params, num_expert_params = _counts(num_dense_params, num_expert_params)
    if spec.parallel.fsdp:
        return SyncCost(0.0, 0.0, 0, 0.0)
    coll = reduce_scatter_s if spec.parallel.use_distributed_optimizer else all_reduce_s
    gb = grad_bytes_per_param(spec)
    return _add(_bucketed(spec, "dp_cp", num_dense_params, gb, coll, bucketed),
                _bucketed(spec, "edp", num_expert_params, gb, coll, bucketed))


def dp_grad_sync_s(spec: RunSpec, num_dense_params, num_expert_params: float = 0.0
                   ) -> float:
    return dp_grad_sync(spec, num_dense_params, num_expert_params).total_s


def param_gather(spec: RunSpec, num_dense_params, num_expert_params: float = 0.0, *,
                 bucketed: bool = True) -> SyncCost:
    """All-gather of the updated parameters (distributed optimizer only), per step."""
    num_dense_params, num_expert_params = _counts(num_dense_params, num_expert_params)
    par = spec.parallel
    if par.fsdp or not par.use_distributed_optimizer:
        return SyncCost(0.0, 0.0, 0, 0.0)
    pb = gathered_param_bytes(spec)
    return _add(_bucketed(spec, "dp_cp", num_dense_params, pb, all_gather_s, bucketed),
                _bucketed(spec, "edp", num_expert_params, pb, all_gather_s, bucketed))


def param_gather_s(spec: RunSpec, num_dense_params, num_expert_params: float = 0.0
                   ) -> float:
    return param_gather(spec, num_dense_params, num_expert_params).total_s


def exposed_dp_s(spec: RunSpec, sync: SyncCost, window_s: float, *, gather: bool = False
                 ) -> float:
    """Exposed part of a gradient sync (``gather=False``, window: the backward of the last
    microbatch on the stage) or a parameter gather (``gather=True``, window: the forward
    of the first microbatch), by the rule in the module docstring."""
    par = spec.parallel
    on = par.overlap_param_gather if gather else par.overlap_grad_reduce
    if not on:
        return sync.total_s
    return exposed_s(spec.cluster.hardware, sync.total_s, window_s, sync.first_bucket_s)
