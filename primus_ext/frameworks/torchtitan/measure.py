"""Measure a downscaled real torchtitan run and write a Profile (the hybrid backend).

``run_measurement(spec, argv)``: ``spec`` is the target (a RunSpec), ``argv`` its
torchtitan command line (``--module``, ``--config``, ``--parallelism.*``, ...). Every
launched process calls it (one process, or under torchrun); all return the same Profile.

1. The downscaled run (``primus_ext.measure.downscale``, framework-neutral): a few blocks,
   each rank's shapes kept (heads, query groups, FFN and vocabulary divided by the TP the
   local processes cannot hold), the pipeline flattened to one stage whose microbatches
   run as gradient accumulation, extra processes as FSDP2 shards (``dp_shard``).
2. torchtitan's own Trainer built from ``argv`` with that layout and model
   (``build.py``), with activation checkpointing off while timing (the projector prices
   recomputation from the measured forward), on a generated local tokenizer and dataset.
3. Per-block hooks (``hooks.py``), the ``torch.distributed`` tracer (FSDP2's
   ``all_gather_single`` / ``reduce_scatter_single``, PP's ``batch_isend_irecv``) and, when
   the measured layout has TP or CP, the functional-collective wrappers
   (``primus_ext.measure.functional_tracer``); warm-up steps, then timed steps.
4. The aggregation shared with megatron-core (``primus_ext.measure.aggregate``): median
   per layer kind over steps, collectives per layer per microbatch, the slowest rank.
"""
from __future__ import annotations

import dataclasses
import datetime
import os
import sys
import tempfile
from dataclasses import dataclass

from primus_ext.spec import RunSpec


@dataclass(frozen=True, kw_only=True, slots=True)
class TitanMeasureOptions:
    warmup: int = 2
    repeats: int = 3
    num_microbatches: int = 2  # accumulated microbatches per measured step
    layers_per_kind: int = 2
    parts: bool = False  # attention / FFN hooks too (more Python on a CPU's critical path)
    contention: bool = True  # CPU: time again with the other cores busy
    contention_rounds: int = 4
    capture_only: bool = False  # one step, no timing use (set when the target is not cpu)
    target_overrides: tuple[str, ...] = ()
    assets_dir: str | None = None  # None: a temporary directory
    memory_gib: float | None = None  # the local budget (measure/budget.py); None: default
    max_seconds: float | None = None

    def __post_init__(self) -> None:
        for name in ("repeats", "num_microbatches", "layers_per_kind"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 1")
        if self.warmup < 0:
            raise ValueError(f"warmup={self.warmup} must be >= 0")


# Flags of a torchtitan line that the measured layout replaces.
_REPLACED = ("--parallelism.data_parallel_shard_degree",
             "--parallelism.data_parallel_replicate_degree",
             "--parallelism.tensor_parallel_degree", "--parallelism.pipeline_parallel_degree",
             "--parallelism.context_parallel_degree", "--parallelism.expert_parallel_degree",
             "--parallelism.pipeline_parallel_schedule",
             "--parallelism.pipeline_parallel_microbatch_size",
             "--training.local_batch_size", "--training.global_batch_size",
             "--training.seq_len", "--training.steps", "--hf_assets_path",
             "--dataloader.dataset", "--dataloader.dataset_path", "--dump_folder",
             "--metrics.log_freq", "--parallelism.fsdp_reshard_after_forward")


def strip_flags(argv: list[str], names=_REPLACED) -> list[str]:
    """``argv`` without the given flags (``--x v`` and ``--x=v`` forms) and without the
    activation-checkpoint subcommand (everything from it on)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a.startswith("activation-checkpoint:"):
            break
        if a in names:
            skip = True
            continue
        if any(a.startswith(n + "=") for n in names):
            continue
        out.append(a)
    return out


def measured_argv(argv: list[str], down_spec: RunSpec, world: int, steps: int,
                  num_microbatches: int, assets: str, dump: str,
                  pipeline: bool = False) -> list[str]:
    """The torchtitan line of the measured run (its layout, batch and local assets). A
    pipeline target (``pipeline``) keeps FSDP2's parameters gathered after forward, as
    torchtitan does under PP (``get_fsdp_reshard_after_forward_policy``)."""
    from primus_ext.frameworks.torchtitan.build import asset_flags
    p, t = down_spec.parallel, down_spec.train
    shard = world // (p.tp * p.cp)
    mbs = t.micro_batch_size
    return strip_flags(argv) + [
        "--parallelism.data_parallel_shard_degree", str(shard),
        "--parallelism.tensor_parallel_degree", str(p.tp),
        "--parallelism.context_parallel_degree", str(p.cp),
        # The config's own defaults otherwise stand (deepseek_v3_16b: EP 8), on a layout
        # of fewer processes.
        "--parallelism.expert_parallel_degree", str(p.ep),
        "--parallelism.pipeline_parallel_degree", "1",
        "--training.local_batch_size", str(mbs),
        "--training.global_batch_size", str(mbs * shard * num_microbatches),
        "--training.seq_len", str(t.seq_length), "--training.steps", str(steps),
        "--dump_folder", dump, "--metrics.log_freq", str(10 ** 6),
        "--parallelism.fsdp_reshard_after_forward", "never" if pipeline else "default",
        *asset_flags(assets), "activation-checkpoint:none"]


def _axes(trainer) -> dict[str, object]:
    """torchtitan's 1-D meshes' groups by the tracer's axis names."""
    names = {"fsdp": "dp", "dp_shard": "dp", "tp": "tp", "pp": "pp", "cp": "cp",
             "ep": "ep", "dp_replicate": "dp_replicate"}
    groups = {}
    for name, mesh in trainer.parallel_dims.get_all_one_dimensional_meshes().items():
        if name in names:
            groups[names[name]] = mesh.get_group()
    return groups


def device_info(world: int) -> dict:
    import torch
    from primus_ext.measure.device import cpu_name
    name = cpu_name()
    return {"kind": "cpu", "name": name, "hardware": "cpu", "count": world,
            "threads": torch.get_num_threads(), "clock": "perf_counter"}


def versions() -> dict:
    from importlib.metadata import version

    import torch

    import primus_ext
    return {"torch": torch.__version__, "torchtitan": version("torchtitan"),
            "python": sys.version.split()[0], "primus_ext": primus_ext.__version__}


def run_measurement(spec: RunSpec, argv: list[str],
                    opts: TitanMeasureOptions = TitanMeasureOptions()):
    """The Profile of ``spec``'s downscaled torchtitan run (see the module docstring)."""
    import torch
    if torch.cuda.is_available():
        raise ValueError("run_measurement times torchtitan on the CPU only in this "
                         "version; on GPUs use backend=simulate")
    from patches.torchtitan_apply import apply_torchtitan_cpu_patches
    patches = apply_torchtitan_cpu_patches()
    from primus_ext.measure.tracer import install_tracer
    tracer = install_tracer()
    from primus_ext.frameworks.torchtitan import build
    from primus_ext.frameworks.torchtitan.measure_plan import agreed_plan, plan_for
    from primus_ext.frameworks.torchtitan.proxy import llama3_gaps
    from primus_ext.measure.downscale import downscale
    from primus_ext.presets.overrides import apply_overrides

    build.single_process_env()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if spec.cluster.hardware.name != "cpu":
        # Times on this CPU cannot stand in for the target's GPUs (the projector
        # simulates them): one step captures the collectives and shapes.
        opts = dataclasses.replace(opts, warmup=0, repeats=1, contention=False,
                                   capture_only=True)
    torchtitan = getattr(spec, "framework", "megatron") == "torchtitan"
    # A torchtitan target's dp_shard counts the target's ranks; the downscaled run's FSDP2
    # degree is what its processes leave (-1, torchtitan's own "the remaining ranks").
    pre = ["parallel.dp_shard=-1"] if torchtitan else []
    target = apply_overrides(spec, pre) if pre else spec
    gaps = llama3_gaps(spec.model)
    if gaps and not opts.capture_only:
        from primus_ext.measure.plan import MeasurementNotBuilt
        raise MeasurementNotBuilt("its layer times would be a llama3-style decoder's, "
                                  "without " + "; ".join(gaps))

    def down_of(c):
        return downscale(target, world, "cpu", layers_per_kind=c.layers_per_kind,
                         num_microbatches=c.num_microbatches, seq_length=c.seq_length,
                         vocab_size=c.vocab_size)
    plan, own_pg = agreed_plan(lambda: plan_for(target, down_of, world, opts), world)
    try:
        return _run_planned(spec, argv, opts, plan, down_of, pre, world, patches, tracer,
                            gaps)
    finally:
        import torch.distributed as dist
        if own_pg and dist.is_initialized():
            dist.destroy_process_group()


def _run_planned(spec, argv, opts, plan, down_of, pre, world, patches, tracer, gaps):
    """The measurement of the planned downscale (run_measurement's second half)."""
    from primus_ext.frameworks.torchtitan import build
    from primus_ext.frameworks.torchtitan.hooks import TitanTimer
    from primus_ext.frameworks.torchtitan.step import StepRunner
    from primus_ext.measure.functional_tracer import FunctionalCollectiveMode
    from primus_ext.measure.hooks import _median
    from primus_ext.measure.plan import MeasurementDoesNotFit
    from primus_ext.presets.overrides import apply_overrides
    if not plan.fits:
        raise MeasurementDoesNotFit(plan.need_line(spec))
    cand = plan.candidate
    opts = dataclasses.replace(opts, num_microbatches=cand.num_microbatches,
                               layers_per_kind=cand.layers_per_kind)
    torchtitan = getattr(spec, "framework", "megatron") == "torchtitan"
    down = down_of(cand)
    down = dataclasses.replace(down, overrides=tuple(pre) + tuple(down.overrides))
    p = down.spec.parallel
    extra: list[str] = []
    rules = list(down.rules)
    if gaps:
        rules.append("model: measured as a llama3-style decoder with the target's per-rank "
                     "dims, without " + "; ".join(gaps) + " (a capture: the times are the "
                     "simulate backend's, which models them)")
    if int(os.environ.get("RANK", "0")) == 0:
        for line in [plan.summary(spec)] + ["  downscale: " + x for x in plan.steps]:
            print("primus-ext: " + line, file=sys.stderr, flush=True)
    if world != p.tp * p.cp:
        shard = world // (p.tp * p.cp)
        # FSDP2 in a torchtitan spec is its dp_shard axis; a megatron-core spec names
        # the same sharding parallel.fsdp. (RunSpec.framework: FIELDS.md.)
        sharding = "parallel.dp_shard" if torchtitan else "parallel.fsdp"
        extra += [f"cluster.gpus_per_node={world}",
                  f"{sharding}={shard if sharding.endswith('dp_shard') else 'true'}",
                  f"train.global_batch_size="
                  f"{down.spec.train.micro_batch_size * shard * opts.num_microbatches}"]
        rules.append(f"dp_shard: {world} processes; {shard} FSDP2 shards")
    timing_spec = apply_overrides(down.spec, ["train.recompute_granularity=null",
                                              "train.recompute_method=null",
                                              "train.recompute_num_layers=null"] + extra)
    rules.append("activation checkpointing off while timing (recompute priced from the "
                 "measured forward)")
    dims = build.ModelDims.of_model(timing_spec.model)
    with tempfile.TemporaryDirectory() as tmp:
        assets = opts.assets_dir or os.path.join(tmp, "assets")
        build.ensure_assets(assets, dims.vocab_size)
        steps = opts.warmup + opts.repeats
        # A pipeline target's stage syncs FSDP2 once per step (step.py).
        pipe = opts.num_microbatches if spec.parallel.pp > 1 else 0
        if pipe:
            rules.append("pp: FSDP2 parameters kept gathered after forward, gradients "
                         "synced on the step's last microbatch (torchtitan's pipeline "
                         "stage)")
        margv = measured_argv(argv, timing_spec, world, steps, opts.num_microbatches,
                              assets, os.path.join(tmp, "dump"), pipeline=pipe > 0)
        config = build.trainer_config(margv, dims)
        trainer = build.build_trainer(config)
        try:
            from primus_ext.frameworks.torchtitan.measure_contention import \
                titan_neighbours

            def neighbours(num: int):
                return titan_neighbours(num, dims.to_json(), assets, margv, pipe)
            profile = _measure(trainer, spec, down, timing_spec, world, opts, tracer,
                               patches, rules, extra, neighbours, TitanTimer,
                               lambda t, timer: StepRunner(t, timer, pipe),
                               FunctionalCollectiveMode, _median,
                               plan_note=plan.summary(spec))
        finally:
            build.teardown(trainer)
    return profile


def _measure(trainer, spec, down, timing_spec, world, opts, tracer, patches, rules, extra,
             neighbours, TitanTimer, StepRunner, FunctionalCollectiveMode, _median,
             plan_note: str = ""):
    import contextlib

    from primus_ext.measure.aggregate import _collectives, _gather_collectives, _gather_max, \
        _timings
    from primus_ext.presets.overrides import spec_overrides
    from primus_ext.project.profile import KindTiming, Profile, rank_shapes
    if len(trainer.model_parts) != 1:
        raise ValueError("the measured run must have one pipeline stage")
    timer = TitanTimer(trainer.model_parts[0]).attach(parts=opts.parts)
    runner = StepRunner(trainer, timer)
    tracer.register_axes(_axes(trainer))
    tracer.scope_fn = timer.scope
    p = timing_spec.parallel
    mode = FunctionalCollectiveMode(tracer) if p.tp * p.cp > 1 else contextlib.nullcontext()
    steps = []
    with mode:
        for _ in range(opts.warmup):
            runner.step()
        timer.enabled = tracer.enabled = True
        tracer.clear()
        for _ in range(opts.repeats):
            steps.append(runner.step())
        timer.enabled = tracer.enabled = False
    records = list(tracer.records)
    tracer.clear()
    local = _timings(timing_spec, timer)
    contention = _contention(runner, timer, timing_spec, world, opts, neighbours) \
        if opts.contention else {}
    runner.close()
    timer.detach()
    m = opts.num_microbatches
    n_layers = {k: v["n_layers"] for k, v in local.items()}
    seen, comm_s = _collectives(timing_spec, records, n_layers, opts.repeats * m,
                                opts.repeats)
    merged, _ = _gather_max(local)
    seen = _gather_collectives(seen)
    num_params = sum(_local_numel(p) for part in trainer.model_parts
                     for p in part.parameters())
    layers = {}
    for kind, d in merged.items():
        if kind == "step" or "fwd" not in d:
            continue
        layers[kind] = KindTiming(
            kind=kind, num_layers=d["n_layers"], num_samples=d.get("n_samples", 0),
            fwd_s=d["fwd"], bwd_s=d.get("bwd", 0.0), parts=d["parts"],
            comm_s=comm_s.get(kind, {}), contention=contention.get(kind, 1.0),
            per_rank_fwd_s=d["per_rank_fwd"],
            per_rank_bwd_s=d["per_rank_bwd"])
    step = {k: _median([s[k] for s in steps]) for k in ("step_s", "zero_grad_s",
                                                        "fwd_bwd_s", "optimizer_s")}
    step.update(num_microbatches=m, num_params_per_rank=int(num_params),
                capture_only=opts.capture_only, executed_flops_per_microbatch={},
                num_expert_params_per_rank=0, loss=None, steps_s=[s["step_s"] for s in steps])
    shapes = rank_shapes(timing_spec)
    shapes["attention_backend"] = "flash"  # SDPA (the CPU's fused attention kernel)
    from primus_ext.measure.provenance import TORCHTITAN_NOTE
    notes = [TORCHTITAN_NOTE,
             "patches: " + ", ".join(patches) if patches else "patches: none (CUDA)"]
    if plan_note:
        notes.append(plan_note)
    if opts.target_overrides:
        notes.append("target given as: " + " ".join(opts.target_overrides))
    return Profile(
        created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        device=device_info(world), versions=versions(),
        target_overrides=tuple(spec_overrides(spec)),
        downscale_overrides=tuple(down.overrides) + tuple(extra), rules=tuple(rules),
        measured_shapes=shapes,
        measured_parallel={"tp": p.tp, "cp": p.cp, "ep": p.ep, "etp": p.expert_tp,
                           "dp": timing_spec.dp, "pp": 1,
                           "sequence_parallel": p.sequence_parallel, "world": world,
                           "num_layers": timing_spec.model.num_layers},
        layers=layers, collectives=tuple(seen), step=step, notes=tuple(notes))


def _contention(runner, timer, spec, world: int, opts, neighbours) -> dict[str, float]:
    """Per-kind slowdown with every other core busy (CPU, fewer ranks than cores): the
    other cores run the same Trainer (``measure_contention.py``: what another rank of the
    target runs), paused and resumed over alternating passes of one step; the ratio of
    the medians of the per-step times of each kind (forward + backward), divided by the
    ratio of the passes' time-slicing (``measure.neighbours.PassClock``: other work on
    the machine makes a busy pass wait for a core, which the target's ranks do not),
    kept in [1, cores]."""
    from collections import defaultdict

    import torch.distributed as dist

    from primus_ext.measure.aggregate import _timings
    from primus_ext.measure.hooks import _median
    from primus_ext.measure.neighbours import PassClock
    cores = os.cpu_count() or 1
    free = cores - world
    if free <= 0:
        return {}
    busy: dict[str, list[float]] = defaultdict(list)
    quiet: dict[str, list[float]] = defaultdict(list)
    sliced: dict[str, list[float]] = {"busy": [], "quiet": []}

    def one_pass(into, which: str) -> None:
        timer.reset()
        timer.enabled = True
        with PassClock() as clock:
            runner.step()
        timer.enabled = False
        sliced[which].append(clock.sliced)
        for kind, d in _timings(spec, timer).items():
            if "fwd" in d:
                into[kind].append(d["fwd"] + d.get("bwd", 0.0))

    with neighbours(free) as nb:
        for _ in range(opts.contention_rounds):
            nb.resume()
            one_pass(busy, "busy")
            nb.pause()
            one_pass(quiet, "quiet")
    timer.reset()
    turns = _median(sliced["busy"]) / _median(sliced["quiet"])
    local = {k: min(max(_median(busy[k]) / _median(quiet[k]) / turns, 1.0), float(cores))
             for k in busy if quiet.get(k) and _median(quiet[k]) > 0}
    # The slowest rank's factor (every rank must take part in the gather).
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, local)
    return {k: max(r.get(k, 1.0) for r in everyone) for k in local}


def _local_numel(param) -> int:
    local = getattr(param, "to_local", None)
    return local().numel() if local is not None else param.numel()
