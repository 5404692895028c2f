"""Plan the measured run before building it (pure: no torch).

The downscaled run must fit the device that measures it (this CPU, or the local GPUs)
and finish in a bounded time. The plan applies the project's own models to candidate
downscales of the target, cheapest restoration first, and keeps the first that fits:

1. the requested measurement (``layers_per_kind`` layers of each kind, the target's
   sequence and vocabulary, ``num_microbatches`` microbatches, the optimizer built);
2. one microbatch per step (per-microbatch layer times do not depend on the count);
3. the optimizer step modelled instead of measured: no fp32 main parameters and Adam
   moments are allocated (the projector's optimizer model on the hardware preset);
4. one layer of each kind;
5. the vocabulary sliced to 32768, 8192, then 2048 entries (the embedding and the
   output layer are restored by their shapes: the simulate backend's target/measured
   ratio on the measuring hardware);
6. the sequence halved, down to 256 tokens (per-token parts -- GEMMs, norms,
   residuals -- scale with the tokens; attention's core, quadratic in the sequence,
   is rescaled on its own ratio).

Memory per process is ``memory_report`` of the candidate on the measuring hardware
(megatron-core's local spec with unfused attention where Transformer Engine is absent:
what is really built), allocated peak, times ``MARGIN`` for allocator and transient
copies, plus the process's own resident base (torch and megatron-core imported). Time is
the simulate backend's fwd+bwd of the candidate on the measuring hardware times the
passes the measurement makes; on a CPU, at the matmul rates this machine reaches
(``host_rates``: ``measure/host_rate.py``), not the ``cpu`` preset's. Nothing fits:
``plan.fits`` is False and ``plan.need_line`` says what the smallest candidate would need.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from primus_ext.presets.overrides import apply_overrides
from primus_ext.spec import RunSpec, padded_vocab

GIB = 1 << 30
# Allocator slack and transient copies (CPU init's fp32 master weight of a layer, the
# loss's fp32 logits) above the modelled allocated peak.
MARGIN = 1.25
VOCAB_SLICES = (32768, 8192, 2048)
MIN_SEQ = 256


class MeasurementDoesNotFit(RuntimeError):
    """No downscale fits the measuring device; the message is the one line to print."""


class MeasurementNotBuilt(MeasurementDoesNotFit):
    """The measured framework cannot build the run's layers; ``why`` names the field."""

    def __init__(self, why: str):
        super().__init__(f"primus-ext: the measurement cannot run this line: {why}; use "
                         "--projection-backend simulate (analytic, no measurement)")


@dataclass(frozen=True, kw_only=True, slots=True)
class Candidate:
    layers_per_kind: int
    num_microbatches: int
    optimizer: bool  # built and measured (False: modelled)
    vocab_size: int | None = None  # None: the target's
    seq_length: int | None = None  # None: the target's

    def describe(self, target: RunSpec) -> str:
        t = target
        return (f"{self.layers_per_kind} layer(s) per kind, {self.num_microbatches} "
                f"microbatch(es), seq {self.seq_length or t.train.seq_length}, vocab "
                f"{self.vocab_size or t.model.vocab_size}, optimizer "
                + ("measured" if self.optimizer else "modelled"))


@dataclass(frozen=True, kw_only=True, slots=True)
class MeasurePlan:
    candidate: Candidate
    fits: bool
    bytes_per_process: int  # modelled peak x MARGIN + base
    num_processes: int  # processes sharing the budget (ranks, CPU contention neighbours)
    budget_bytes: int
    seconds: float  # estimated compute of all passes on the measuring hardware
    seconds_budget: float
    steps: tuple[str, ...]  # what the plan changed from the request, in order
    hardware: str

    @property
    def total_bytes(self) -> int:
        return self.bytes_per_process * self.num_processes

    def summary(self, target: RunSpec) -> str:
        return (f"plan: {self.candidate.describe(target)}; memory {self.bytes_per_process / GIB:.2f} "
                f"GiB x {self.num_processes} process(es) = {self.total_bytes / GIB:.2f} of "
                f"{self.budget_bytes / GIB:.2f} GiB budget on {self.hardware}; compute "
                f"~{self.seconds:.0f} s of {self.seconds_budget:.0f} s")

    def need_line(self, target: RunSpec) -> str:
        return (f"primus-ext: the measurement does not fit {self.hardware}: its smallest "
                f"downscale ({self.candidate.describe(target)}) needs "
                f"{self.total_bytes / GIB:.1f} GiB ({self.num_processes} process(es)) of a "
                f"{self.budget_bytes / GIB:.1f} GiB budget and ~{self.seconds:.0f} s of "
                f"{self.seconds_budget:.0f} s; use --projection-backend simulate "
                "(analytic, no measurement) or raise --measure-memory-gib / "
                "--measure-max-seconds")


def _ladder(target: RunSpec, req: Candidate, optimizer_optional: bool = True):
    """Steps, each one cheaper than the last: (name, candidate -> candidate or None).
    ``optimizer_optional`` False: the measured framework always builds its optimizer."""
    yield "microbatches", lambda c: dataclasses.replace(c, num_microbatches=1) \
        if c.num_microbatches > 1 else None
    if optimizer_optional:
        yield "optimizer", lambda c: dataclasses.replace(c, optimizer=False) \
            if c.optimizer else None
    yield "layers", lambda c: dataclasses.replace(c, layers_per_kind=1) \
        if c.layers_per_kind > 1 else None
    v_t = target.model.vocab_size
    for v in VOCAB_SLICES:
        yield "vocab", lambda c, v=v: dataclasses.replace(c, vocab_size=v) \
            if v < v_t and v < (c.vocab_size or v_t) else None
    s = target.train.seq_length
    unit = 2 * target.parallel.cp * target.parallel.tp
    while s // 2 >= MIN_SEQ and (s // 2) % unit == 0:
        s //= 2
        yield "seq", lambda c, s=s: dataclasses.replace(c, seq_length=s) \
            if s < (c.seq_length or target.train.seq_length) else None


def _step_text(name: str, c: Candidate, target: RunSpec) -> str:
    return {
        "microbatches": "microbatches: 1 per step (per-microbatch times do not depend on it)",
        "optimizer": "optimizer: modelled (no fp32 main parameters and moments allocated); "
                     "the projector's optimizer model on the hardware preset",
        "layers": "layers: one of each kind",
        "vocab": f"vocab: {target.model.vocab_size} -> {c.vocab_size} (embedding and output "
                 "restored by shape)",
        "seq": f"seq: {target.train.seq_length} -> {c.seq_length} (per-token parts by "
               "tokens, core attention on its own ratio)",
    }[name]


# A step is taken only if it cuts what is over budget by at least this fraction.
MIN_GAIN = 0.05


def local_view(spec: RunSpec, use_te: bool) -> RunSpec:
    """``spec`` as ``frameworks/megatron/build.py`` builds it on the measuring device:
    gradients accumulated in fp32 unless the run is fp32 (its DDP config), and without
    Transformer Engine megatron-core's local spec with unfused attention."""
    ov = [f"parallel.grad_reduce_in_fp32={str(spec.train.precision != 'fp32').lower()}"]
    if not use_te:
        ov += ["train.te=false", "train.attention_backend=unfused"]
    return apply_overrides(spec, ov)


def _num_passes(warmup: int, repeats: int, capture: bool, contention: bool,
                cuda: bool) -> int:
    """Training steps the measurement runs (runner.measure and probes.py)."""
    if capture:
        return 1
    n = warmup + repeats + 1 + max(2, repeats // 2)
    if contention:
        n += 24  # probes._contention: 6 rounds x (busy, quiet) x 2 steps
    return n + (1 if cuda else 0)


def _at_rates(spec: RunSpec, rates: dict[str, float] | None) -> RunSpec:
    """``spec`` with its hardware's rate fields replaced by ``rates``."""
    if not rates:
        return spec
    hw = dataclasses.replace(spec.cluster.hardware, **rates)
    return dataclasses.replace(spec, cluster=dataclasses.replace(spec.cluster, hardware=hw))


def candidate_cost(target: RunSpec, down: RunSpec, cand: Candidate, *, use_te: bool,
                   passes: int, base_bytes: int, cuda: bool,
                   host_rates: dict[str, float] | None = None) -> tuple[int, float]:
    """(bytes per process, estimated seconds) of the measured run ``down``;
    ``host_rates``: the hardware's rate fields as measured here (None: the preset's)."""
    from primus_ext.memory import memory_report
    from primus_ext.project.simulate_backend import simulate_layer_costs
    view = local_view(down, use_te)
    rep = memory_report(view).stages[0]
    peak = rep.total_bytes if cuda else rep.allocated_peak_bytes
    if not cand.optimizer:
        peak -= rep.optimizer_bytes
    costs = simulate_layer_costs(_at_rates(view, host_rates))
    per_mb = 0.0
    for name in ("embedding", "output"):
        k = costs.kinds.get(name)
        if k is not None:
            per_mb += k.fwd_s + k.bwd_input_s + k.bwd_weight_s
    for i in range(len(costs.decoder_kinds)):
        k = costs.decoder_layer(i)
        per_mb += k.fwd_s + k.bwd_input_s + k.bwd_weight_s
    # The activation count adds one microbatch forward+backward.
    seconds = per_mb * (passes * cand.num_microbatches + 1)
    return int(peak * MARGIN) + base_bytes, seconds


def plan_measurement(target: RunSpec, downscale_fn, request: Candidate, *, hardware: str,
                     use_te: bool, num_processes: int, budget_bytes: int,
                     seconds_budget: float, base_bytes: int, warmup: int, repeats: int,
                     capture: bool, contention: bool, cuda: bool,
                     optimizer_optional: bool = True,
                     host_rates: dict[str, float] | None = None) -> MeasurePlan:
    """The first candidate of the ladder that fits (see the module docstring).

    ``downscale_fn(candidate) -> RunSpec`` is the downscaled run of a candidate;
    ``num_processes`` the processes sharing ``budget_bytes`` (on a GPU: one per device,
    ``budget_bytes`` per device); ``host_rates``: the measuring hardware's rate fields as
    this machine reaches them (``measure/host_rate.measured_rates``; None: the preset's)."""
    def cost(c: Candidate) -> tuple[int, float]:
        passes = _num_passes(warmup, repeats, capture, contention, cuda)
        return candidate_cost(target, downscale_fn(c), c, use_te=use_te, passes=passes,
                              base_bytes=base_bytes, cuda=cuda, host_rates=host_rates)

    def make(c: Candidate, nbytes: int, secs: float, steps: dict) -> MeasurePlan:
        ok = nbytes * num_processes <= budget_bytes and secs <= seconds_budget
        return MeasurePlan(candidate=c, fits=ok, bytes_per_process=nbytes,
                           num_processes=num_processes, budget_bytes=budget_bytes,
                           seconds=secs, seconds_budget=seconds_budget,
                           steps=tuple(steps.values()), hardware=hardware)

    cand, steps = request, {}
    nbytes, secs = cost(cand)
    plan = make(cand, nbytes, secs, steps)
    for name, step in _ladder(target, request, optimizer_optional):
        if plan.fits:
            break
        nxt = step(cand)
        if nxt is None:
            continue
        nb, ns = cost(nxt)
        over_mem = nbytes * num_processes > budget_bytes
        over_time = secs > seconds_budget
        gain = max((1 - nb / nbytes) if over_mem else 0.0,
                   (1 - ns / secs) if over_time and secs > 0 else 0.0)
        if gain < MIN_GAIN:
            continue
        cand, nbytes, secs = nxt, nb, ns
        steps[name] = _step_text(name, cand, target)
        plan = make(cand, nbytes, secs, steps)
    return plan


def vocab_for(target: RunSpec, vocab: int | None, tp_local: int) -> int | None:
    """A sliced vocabulary padded as megatron-core pads it on ``tp_local`` ranks."""
    if vocab is None:
        return None
    m = target.model
    return padded_vocab(vocab, m.make_vocab_size_divisible_by, tp_local)
