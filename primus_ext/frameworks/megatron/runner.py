"""Measure a downscaled real megatron-core run and write a Profile.

Every launched rank calls ``measure``; all return the same Profile. The order of work:
the plan (``measure/plan.py``: the downscale that fits the measuring device's memory and
time budgets, chosen by the memory model before anything large is allocated; rank 0
plans, every rank follows), the downscaled spec, the model built with the timing hooks, communication
microbenchmarks on its process groups, warm-up and timed training steps (median per
layer kind), then the saved-activation count of one forward under the target's
recompute setting, gathered over ranks (the slowest rank's times).
"""
from __future__ import annotations

import dataclasses
import datetime
import sys
from dataclasses import dataclass

import torch
import torch.distributed as dist

from primus_ext.measure.aggregate import _collectives, _gather_collectives, _gather_max, \
    _mean_comm, _mean_over_ranks, _part_comm, _timings
from primus_ext.frameworks.megatron.build import build, init_distributed, not_built, \
    prepare_runtime, teardown
from primus_ext.measure.downscale import Downscaled, downscale
from primus_ext.measure.hooks import LayerTimer, _median
from primus_ext.presets.overrides import apply_overrides, spec_overrides
from primus_ext.frameworks.megatron.probes import _activation_bytes, _contention, _pipeline_probe, \
    _run_steps, _synced_records
from primus_ext.project.profile import KindTiming, Profile, rank_shapes
from primus_ext.measure.plan import Candidate, MeasurePlan, MeasurementDoesNotFit, \
    MeasurementNotBuilt, plan_measurement
from primus_ext.measure.progress import Progress
from primus_ext.measure.routing import RoutingRecorder
from primus_ext.spec import RunSpec

_GPU_PRESETS = (("GB300", "gb300"), ("GB200", "gb200"), ("B300", "b300"), ("B200", "b200"),
                ("H200", "h200"), ("H800", "h800"), ("H100", "h100"), ("A100", "a100"),
                ("MI355", "mi355x"), ("MI325", "mi325x"), ("MI300", "mi300x"))


@dataclass(frozen=True, kw_only=True, slots=True)
class MeasureOptions:
    warmup: int = 2
    repeats: int = 3
    num_microbatches: int = 2
    layers_per_kind: int = 2
    microbench: bool = True
    microbench_repeats: int = 5
    count_activations: bool = True
    contention: bool = True  # CPU: time again with the other cores busy
    target_overrides: tuple[str, ...] = ()  # as the user gave them (kept in the notes)
    local_hardware: str | None = None  # None: detect (cpu, or the GPU's preset)
    # One capturing step, no timing (None: when the local hardware is not the target's).
    capture_only: bool | None = None
    # Budgets of the measuring device (measure/budget.py): None takes the device's own.
    memory_gib: float | None = None
    max_seconds: float | None = None
    progress: bool = True  # rank 0 reports each step on stderr


def local_hardware() -> str:
    if not torch.cuda.is_available():
        return "cpu"
    name = torch.cuda.get_device_name().upper()
    for key, preset in _GPU_PRESETS:
        if key in name:
            return preset
    return "h100"


def device_info(hw: str) -> dict:
    if torch.cuda.is_available():
        return {"kind": "cuda", "name": torch.cuda.get_device_name(), "hardware": hw,
                "count": dist.get_world_size(), "clock": "cuda_events"}
    from primus_ext.measure.device import cpu_name
    name = cpu_name()
    return {"kind": "cpu", "name": name, "hardware": hw, "count": dist.get_world_size(),
            "threads": torch.get_num_threads(), "clock": "perf_counter"}


def versions() -> dict:
    import megatron.core
    import primus_ext
    return {"torch": torch.__version__,
            "megatron_core": getattr(megatron.core, "__version__", "?"),
            "python": sys.version.split()[0], "primus_ext": primus_ext.__version__}


def _no_recompute(spec: RunSpec) -> RunSpec:
    if spec.train.recompute_granularity is None:
        return spec
    return apply_overrides(spec, ["train.recompute_granularity=null",
                                  "train.recompute_method=null",
                                  "train.recompute_num_layers=null"])


def measure(target: RunSpec, opts: MeasureOptions = MeasureOptions()) -> Profile:
    """Run the downscaled measurement of ``target`` on the launched processes."""
    from primus_ext.measure.microbench import run_microbenchmarks
    from primus_ext.frameworks.megatron.step import data_iterators

    why = not_built(target)
    if why:
        raise MeasurementNotBuilt(why)
    patches = prepare_runtime()
    rank, world = init_distributed()
    hw = opts.local_hardware or local_hardware()
    # On other hardware than the target's, times cannot stand in for the target's: one
    # step captures ops, collectives and activations (no optimizer, fits or contention).
    same = target.cluster.hardware.name == hw
    capture = (not same) if opts.capture_only is None else opts.capture_only
    if capture:
        opts = dataclasses.replace(opts, warmup=0, repeats=1, num_microbatches=1,
                                   layers_per_kind=1, contention=False, microbench=False)
    prog = Progress(enabled=opts.progress and rank == 0)
    plan = plan_for(target, world, hw, opts, capture, same)
    prog.say(plan.summary(target))
    for line in plan.steps:
        prog.say("  downscale: " + line)
    if not plan.fits:
        raise MeasurementDoesNotFit(plan.need_line(target))
    cand = plan.candidate
    opts = dataclasses.replace(opts, num_microbatches=cand.num_microbatches,
                               layers_per_kind=cand.layers_per_kind)
    down = downscale_for(target, world, hw, opts, cand)
    timing_spec = _no_recompute(down.spec)
    with prog.step(f"build: {timing_spec.model.num_layers} layer(s), seq "
                   f"{timing_spec.train.seq_length}, vocab {timing_spec.model.vocab_size}"):
        built = build(timing_spec, with_optimizer=cand.optimizer)
    use_te = built.use_te
    timer = LayerTimer(built.bare()).attach(parts=False)
    fits = []
    if opts.microbench and world > 1 and same:
        with prog.step("collectives: microbenchmarks on the process groups"):
            fits = run_microbenchmarks(built.groups, repeats=opts.microbench_repeats)

    iters = data_iterators(built)
    m = timing_spec.num_microbatches
    routing = RoutingRecorder(built.bare()).attach()
    routing.enabled = timing_spec.model.is_moe
    with prog.step("capture step" if capture else
                   f"warmup ({opts.warmup}) and timed ({opts.repeats}) steps"):
        steps, records = _run_steps(built, timer, iters, m, opts.warmup, opts.repeats,
                                    progress=prog)
    routing.detach()
    expert_loads = routing.gathered()
    local = _timings(timing_spec, timer)
    synced = None
    if torch.cuda.is_available():
        with prog.step("collectives: one device-synced step"):
            synced = _synced_records(built, timer, iters, m)
    contention = {}
    # The projection applies it only where the target keeps more ranks of a node busy
    # than were measured (project/from_profile.py).
    if same and opts.contention and \
            min(target.cluster.node_size, target.world_size) > world:
        with prog.step("contention: the same steps with the other cores busy"):
            contention = _contention(built, timer, iters, m, opts, local, timing_spec)
    timer.detach()
    if not capture:
        with prog.step("parts: attention and MLP times"):
            _time_parts(built, iters, m, opts, timing_spec, local)

    n_layers = {k: v["n_layers"] for k, v in local.items()}
    samples = opts.repeats * m
    seen, comm_s = _collectives(timing_spec, records, n_layers, samples, opts.repeats,
                                synced)
    merged, _ = _gather_max(local)
    seen = _gather_collectives(seen)
    comm_s = _mean_comm(comm_s)
    num_params = sum(p.numel() for c in built.model for p in c.parameters())
    # megatron-core tags expert parameters with allreduce=False.
    num_expert = sum(p.numel() for c in built.model for p in c.parameters()
                     if not getattr(p, "allreduce", True))

    act: dict[str, int] = {}
    flops: dict = {}
    if opts.count_activations:
        with prog.step("activations: saved bytes and executed FLOPs of one microbatch"):
            if down.spec.train.recompute_granularity is not None:
                del built
                teardown()
                built = build(down.spec, with_optimizer=False)
            act, flops = _activation_bytes(built, down.spec)
            act = _mean_over_ranks(act)
    del built
    teardown()
    pipe: dict = {}
    if target.parallel.pp > 1:
        with prog.step("collectives: two-stage pipeline probe"):
            sends, pipe = _pipeline_probe(target, timing_spec, world, warm=not capture)
            seen += sends

    layers = {}
    for kind, d in merged.items():
        if kind == "step" or "fwd" not in d:
            continue
        layers[kind] = KindTiming(
            kind=kind, num_layers=d["n_layers"], num_samples=d.get("n_samples", 0),
            fwd_s=d["fwd"], bwd_s=d.get("bwd", 0.0), parts=d["parts"],
            comm_s=comm_s.get(kind, {}), contention=contention.get(kind, 1.0),
            activation_bytes=act.get(kind), per_rank_fwd_s=d["per_rank_fwd"],
            per_rank_bwd_s=d["per_rank_bwd"],
            expert_loads=expert_loads if kind == "moe" else ())
    step = {k: _median([s[k] for s in steps]) for k in ("step_s", "zero_grad_s", "fwd_bwd_s",
                                                   "optimizer_s", "finalize_s")}
    step.update(num_microbatches=m, num_params_per_rank=int(num_params), capture_only=capture,
                executed_flops_per_microbatch=flops,
                num_expert_params_per_rank=int(num_expert),
                loss=steps[-1]["loss"] if steps else None,
                optimizer="measured" if cand.optimizer else "modelled",
                steps_s=[s["step_s"] for s in steps])
    if pipe:
        step["pipeline_probe"] = pipe
    shapes = rank_shapes(timing_spec)
    shapes["attention_backend"] = "flash" if use_te else "unfused"
    if shapes["precision"] == "fp8":
        shapes["precision"] = "bf16"  # no FP8 autocast in the measured run
    p = timing_spec.parallel
    notes = ["patches: " + ", ".join(patches) if patches else "patches: none (CUDA)",
             plan.summary(target)]
    if opts.target_overrides:
        notes.append("target given as: " + " ".join(opts.target_overrides))
    return Profile(
        created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        device=device_info(hw), versions=versions(),
        target_overrides=tuple(spec_overrides(target)),
        downscale_overrides=down.overrides, rules=down.rules, measured_shapes=shapes,
        measured_parallel={"tp": p.tp, "cp": p.cp, "ep": p.ep, "etp": p.expert_tp,
                           "dp": timing_spec.dp, "pp": 1,
                           "sequence_parallel": p.sequence_parallel, "world": world,
                           "num_layers": timing_spec.model.num_layers},
        layers=layers, collectives=tuple(seen), step=step, comm_fits=tuple(fits),
        notes=tuple(notes))


def _time_parts(built, iters, m: int, opts: MeasureOptions, spec: RunSpec,
                local: dict) -> None:
    """Attention / MLP sub-module times from a separate pass with their hooks (kept out
    of the main pass: on a CPU each hook is Python on the critical path), net of the
    collectives traced inside them; stored as ``local[kind]["parts"]``."""
    timer = LayerTimer(built.bare()).attach(parts=True)
    reps = max(2, opts.repeats // 2)
    _, records = _run_steps(built, timer, iters, m, 1, reps)
    parts = _timings(spec, timer)
    timer.detach()
    comm = _part_comm(spec, records, {k: v["n_layers"] for k, v in parts.items()}, reps * m,
                      blocked=not torch.cuda.is_available())
    for kind, d in parts.items():
        if kind not in local:
            continue
        local[kind]["parts"] = {
            part: {ph: max(t - comm.get((kind, part, ph), 0.0), 0.0) for ph, t in v.items()}
            for part, v in d["parts"].items()}


def plan_for(target: RunSpec, world: int, hw: str, opts: MeasureOptions, capture: bool,
             same: bool) -> MeasurePlan:
    """The measurement plan (measure/plan.py), made on rank 0 and followed by all."""
    from primus_ext.frameworks.megatron.build import use_transformer_engine
    from primus_ext.measure.budget import local_budget, local_processes
    from primus_ext.measure.host_rate import measured_rates
    plan = [None]
    if dist.get_rank() == 0:
        cuda = torch.cuda.is_available()
        local = local_processes(world)
        import os
        busy = min(target.cluster.node_size, target.world_size) > world
        neighbours = max((os.cpu_count() or 1) - world, 0) \
            if (not cuda and same and opts.contention and busy) else 0
        budget = local_budget(opts.memory_gib, opts.max_seconds, cuda=cuda,
                              num_local_processes=local + neighbours)
        req = Candidate(layers_per_kind=opts.layers_per_kind,
                        num_microbatches=opts.num_microbatches, optimizer=not capture)
        plan[0] = plan_measurement(
            target, lambda c: downscale_for(target, world, hw, opts, c).spec, req,
            hardware=hw, use_te=use_transformer_engine(), num_processes=budget.num_processes,
            budget_bytes=budget.memory_bytes, seconds_budget=budget.seconds,
            base_bytes=budget.base_bytes, warmup=opts.warmup, repeats=opts.repeats,
            capture=capture, contention=neighbours > 0, cuda=cuda,
            host_rates=None if cuda else measured_rates(target.train.precision))
    dist.broadcast_object_list(plan, src=0)
    return plan[0]


def downscale_for(target: RunSpec, world: int, hw: str, opts: MeasureOptions,
                  cand: Candidate | None = None) -> Downscaled:
    """The downscaled run for ``world`` launched processes: every process takes part
    (extra ones as data-parallel replicas); overlap of DP sync is off while timing."""
    layers = cand.layers_per_kind if cand else opts.layers_per_kind
    mbs = cand.num_microbatches if cand else opts.num_microbatches
    down = downscale(target, world, hw, layers_per_kind=layers, num_microbatches=mbs,
                     seq_length=cand.seq_length if cand else None,
                     vocab_size=cand.vocab_size if cand else None)
    extra = ["parallel.overlap_grad_reduce=false", "parallel.overlap_param_gather=false"]
    rules = list(down.rules) + ["overlap: DP grad/param overlap off while timing layers"]
    if cand is not None and not cand.optimizer:
        rules.append("optimizer: not built; its step is modelled (the projector's "
                     "optimizer model on the target's hardware preset)")
    if down.world_size != world:
        if world % down.world_size:
            raise ValueError(f"{world} processes cannot run the downscaled layout of "
                             f"{down.world_size} ranks; launch a multiple of it")
        dp = world // (down.spec.parallel.tp * down.spec.parallel.cp)
        t = down.spec.train
        extra += [f"cluster.gpus_per_node={world}",
                  f"train.global_batch_size={t.micro_batch_size * dp * mbs}"]
        rules.append(f"dp: {world} processes launched; the extra ones run as data-parallel "
                     "replicas")
    spec = apply_overrides(down.spec, extra)
    return dataclasses.replace(down, spec=spec, overrides=down.overrides + tuple(extra),
                               rules=tuple(rules), world_size=world)
