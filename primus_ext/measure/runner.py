"""Measure a downscaled real megatron-core run and write a Profile.

Every launched rank calls ``measure``; all return the same Profile. The order of work:
the downscaled spec, the model built with the timing hooks, communication
microbenchmarks on its process groups, warm-up and timed training steps (median per
layer kind), then the saved-activation count of one forward under the target's
recompute setting, gathered over ranks (the slowest rank's times).
"""
from __future__ import annotations

import dataclasses
import datetime
import platform
import sys
from collections import defaultdict
from dataclasses import dataclass

import torch
import torch.distributed as dist

from primus_ext.measure.build import Built, build, init_distributed, prepare_runtime, teardown
from primus_ext.measure.downscale import Downscaled, downscale, rank_shapes
from primus_ext.measure.hooks import LayerTimer, _median
from primus_ext.measure.overrides import apply_overrides, spec_overrides
from primus_ext.measure.profile import CollectiveSeen, KindTiming, Profile
from primus_ext.spec import RunSpec

IN_LAYER_AXES = ("tp", "cp", "ep", "etp", "tp_ep")
_BYTES_SIDE = {"all_gather": "out", "reduce_scatter": "in", "all_reduce": "in",
               "all_to_all": "in", "p2p": "in", "broadcast": "in", "reduce": "in"}
_GPU_PRESETS = (("GB200", "gb200"), ("B200", "b200"), ("H200", "h200"), ("H800", "h800"),
                ("H100", "h100"), ("A100", "a100"), ("MI355", "mi355x"),
                ("MI325", "mi325x"), ("MI300", "mi300x"))


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
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    name = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
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


def _kind_of(spec: RunSpec, scope: str) -> tuple[str, str]:
    """(kind, part) of a tracer/timer scope."""
    if scope.startswith("layer."):
        bits = scope.split(".")
        i = int(bits[1])
        return ("moe" if spec.model.is_moe_layer(i) else "dense"), (
            bits[2] if len(bits) > 2 else "layer")
    if scope in ("embedding", "output"):
        return scope, "layer"
    return "step", "step"


def _timings(spec: RunSpec, timer: LayerTimer) -> dict[str, dict]:
    """kind -> {fwd, bwd, parts, n_layers, n_samples} (medians over all samples)."""
    pooled: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    layers: dict[str, set] = defaultdict(set)
    for (scope, phase), xs in timer.samples.items():
        kind, part = _kind_of(spec, scope)
        pooled[(kind, part, phase)].extend(xs)
        layers[kind].add(scope.split(".")[1] if scope.startswith("layer.") else scope)
    out: dict[str, dict] = {}
    for (kind, part, phase), xs in pooled.items():
        d = out.setdefault(kind, {"parts": {}, "n_layers": len(layers[kind])})
        if part == "layer":
            d[phase] = _median(xs)
            d["n_samples"] = max(d.get("n_samples", 0), len(xs))
        else:
            d["parts"].setdefault(part, {})[phase] = _median(xs)
    return out


def _collectives(spec: RunSpec, records, n_layers: dict[str, int], samples: int,
                 steps: int, timed_records=None
                 ) -> tuple[list[CollectiveSeen], dict[str, dict[str, dict[str, float]]]]:
    """Collectives seen per kind; and their seconds per layer per microbatch by
    kind -> axis -> phase. ``timed_records`` (a step traced with device syncs, on CUDA)
    gives the seconds when the plain records only hold launch times."""
    groups: dict[tuple, list] = defaultdict(list)
    secs_of: dict[tuple, list] = defaultdict(list)
    comm_s: dict = defaultdict(lambda: defaultdict(lambda: {"fwd": 0.0, "bwd": 0.0}))
    cp = spec.parallel.cp

    def key_of(r):
        kind, part = _kind_of(spec, r.scope)
        axis = "dp" if r.axis == "dp_cp" and cp == 1 else r.axis
        phase = r.phase if kind != "step" else "step"
        return (kind, part, r.op, r.collective, axis, phase, r.group_size, r.dtype)

    for r in records:
        nbytes = r.out_bytes if _BYTES_SIDE.get(r.collective) == "out" else r.in_bytes
        groups[key_of(r)].append(nbytes)
        secs_of[key_of(r)].append((nbytes, r.seconds))
    if timed_records:
        secs_of = defaultdict(list)
        for r in timed_records:
            nbytes = r.out_bytes if _BYTES_SIDE.get(r.collective) == "out" else r.in_bytes
            secs_of[key_of(r)].append((nbytes, r.seconds))
    seen = []
    for key, xs in sorted(groups.items()):
        kind, part, op, coll, axis, phase, size, dtype = key
        per = steps if kind == "step" else max(n_layers.get(kind, 1), 1) * samples
        for lo, hi in _size_classes(xs):
            cls = [x for x in xs if lo <= x <= hi]
            count = len(cls) / per
            secs = _median([t for b, t in secs_of.get(key, []) if lo <= b <= hi] or [0.0])
            seen.append(CollectiveSeen(kind=kind, part=part, op=op, collective=coll,
                                       axis=axis, phase=phase, group_size=size,
                                       num_bytes=sum(cls) / len(cls), count=count,
                                       seconds=secs, dtype=dtype))
            if kind != "step" and phase in ("fwd", "bwd"):
                comm_s[kind][axis][phase] += count * secs
    return seen, {k: {a: dict(v) for a, v in d.items()} for k, d in comm_s.items()}


def _size_classes(sizes: list[float], gap: float = 16.0) -> list[tuple[float, float]]:
    """Split call sizes where consecutive sorted sizes jump by more than ``gap``x: the
    MoE dispatcher sends tokens (h values per row) and their routing weights (one value
    per row) through the same all-to-all, and routing makes both vary per call."""
    xs = sorted(sizes)
    classes, lo = [], xs[0]
    for a, b in zip(xs, xs[1:]):
        if b > gap * max(a, 1):
            classes.append((lo, a))
            lo = b
    classes.append((lo, xs[-1]))
    return classes


def _run_steps(built: Built, timer: LayerTimer, iters, m: int, warmup: int, repeats: int,
               trace: bool = True) -> tuple[list[dict], list]:
    """Warm-up then timed steps with the hooks on; (step results, traced records)."""
    from primus_ext.measure.step import train_step
    from primus_ext.measure.tracer import get_tracer
    tracer = get_tracer()
    tracer.scope_fn = timer.scope
    steps = []
    try:
        for it in range(warmup + repeats):
            if it == warmup:
                timer.reset()
                tracer.clear()
            timer.enabled = True
            tracer.enabled = trace
            r = train_step(built, iters, m)
            timer.collect()
            if it >= warmup:
                steps.append(r)
    finally:
        timer.enabled = False
        tracer.enabled = False
        tracer.scope_fn = lambda: ("step", "step")
    records = list(tracer.records)
    tracer.clear()
    return steps, records


def _synced_records(built: Built, timer: LayerTimer, iters, m: int) -> list:
    """One step traced with a device sync around every collective (CUDA only: there
    the plain trace holds launch times); layer timings of this step are discarded."""
    import torch.cuda
    from primus_ext.measure.tracer import get_tracer
    tracer = get_tracer()
    tracer.sync_fn = torch.cuda.synchronize
    try:
        _, records = _run_steps(built, timer, iters, m, 0, 1)
    finally:
        tracer.sync_fn = lambda: None
    timer.reset()
    return records


def _pipeline_probe(target: RunSpec, spec: RunSpec, world: int, warm: bool = True
                    ) -> list[CollectiveSeen]:
    """When the target pipelines and two stages fit the launched processes: one step of
    a two-stage pipeline of the measured layers, to capture the p2p sends."""
    from primus_ext.measure.step import data_iterators
    from primus_ext.measure.tracer import get_tracer
    p = spec.parallel
    inner = p.tp * p.cp
    if target.parallel.pp == 1 or world % (2 * inner):
        return []
    dp = world // (2 * inner)
    t = spec.train
    probe = apply_overrides(spec, ["parallel.pp=2", f"train.global_batch_size="
                                   f"{t.micro_batch_size * dp * 2}",
                                   f"model.num_layers={max(spec.model.num_layers, 2)}"])
    teardown()
    built = build(probe, with_optimizer=warm)
    tracer = get_tracer()
    timer = LayerTimer(built.bare())  # not attached: only the scope function
    if warm:
        _run_steps(built, timer, data_iterators(built), 2, 1, 0, trace=False)
    _, records = _run_steps(built, timer, data_iterators(built), 2, 0, 1)
    teardown()
    sends = [(r.in_bytes, r.seconds) for r in records if r.collective == "p2p" and r.in_bytes]
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, sends)
    sends = [x for rows in everyone for x in rows]
    if not sends:
        return []
    per_send = _median([b for b, _ in sends])
    return [CollectiveSeen(kind="pipeline", part="p2p", op="batch_isend_irecv",
                           collective="p2p", axis="pp", phase="step", group_size=2,
                           num_bytes=per_send, count=len(sends) / world / 2,
                           seconds=_median([x for _, x in sends]),
                           dtype=str(t.precision))]


def _activation_bytes(built: Built, spec: RunSpec) -> tuple[dict[str, int], dict]:
    """Saved-for-backward bytes per kind, per layer per microbatch (one forward), and the
    executed FLOPs the ops of that microbatch performed (``FlopCounterMode``): forward
    FLOPs per layer kind and the forward+backward total. Backward FLOPs are counted in
    total only: autograd runs them outside the modules' hooks."""
    from torch.utils.flop_counter import FlopCounterMode

    from primus_ext.measure.saved_tensors import SavedTensorCounter, gpt_scopes
    from primus_ext.measure.step import data_iterators, forward_step
    bare = built.bare()
    params = [p for c in built.model for p in c.parameters()]
    counter = SavedTensorCounter(scopes=gpt_scopes(bare), params=params)
    it = data_iterators(built, seed=99)[0]
    for c in built.model:
        c.zero_grad_buffer()
    flops = FlopCounterMode(display=False)
    with flops:
        with counter.counting():
            out, loss_fn = forward_step(it, built.model[0])
            by_scope = counter.bytes_by_scope()
        fwd_counts = {k: sum(v.values()) for k, v in flops.get_flop_counts().items()}
        fwd_total = flops.get_total_flops()
        loss = loss_fn(out)[0]
        loss.backward()
        total = flops.get_total_flops()
    del out, loss_fn, loss
    sums: dict[str, list[int]] = defaultdict(list)
    for scope, nbytes in by_scope.items():
        if scope.startswith("layer."):
            kind, _ = _kind_of(spec, scope)
            sums[kind].append(nbytes)
    out_d = {k: int(sum(v) / len(v)) for k, v in sums.items()}
    out_d["embedding"] = int(by_scope.get("embedding", 0))
    out_d["output"] = int(by_scope.get("output_layer", 0) + by_scope.get("final_norm", 0))
    per_layer: dict[str, list[int]] = defaultdict(list)
    out_flops = 0
    for name, n in fwd_counts.items():
        bits = name.split(".")
        if len(bits) >= 2 and bits[-2] == "layers" and bits[-1].isdigit():
            kind = "moe" if spec.model.is_moe_layer(int(bits[-1])) else "dense"
            per_layer[kind].append(n)
        elif bits[-1] == "output_layer":
            out_flops += n
    f = {f"{k}_fwd_flops": sum(v) / len(v) for k, v in per_layer.items()}
    f.update(output_fwd_flops=out_flops, fwd_flops=fwd_total, total_flops=total)
    return out_d, f


def _mean_over_ranks(values: dict[str, int]) -> dict[str, int]:
    """Mean over ranks: routed-expert activations vary per rank with the routing, their
    sum over the expert-parallel group does not."""
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, values)
    keys = set().union(*everyone)
    return {k: int(round(sum(r.get(k, 0) for r in everyone) / len(everyone))) for k in keys}


def _gather_collectives(seen: list[CollectiveSeen]) -> list[CollectiveSeen]:
    """Mean bytes and counts over ranks (routing makes MoE all-to-all sizes differ per
    rank; the mean over ranks is exact), the slowest rank's seconds."""
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, [dataclasses.asdict(c) for c in seen])
    by: dict[tuple, list[dict]] = defaultdict(list)
    for rows in everyone:
        for c in rows:
            by[(c["kind"], c["part"], c["op"], c["collective"], c["axis"], c["phase"],
                c["group_size"], c["dtype"])].append(c)
    n = len(everyone)
    out = []
    for key, rows in sorted(by.items()):
        for lo, hi in _size_classes([r["num_bytes"] for r in rows]):
            cls = [r for r in rows if lo <= r["num_bytes"] <= hi]
            base = dict(cls[0])
            base["num_bytes"] = sum(r["num_bytes"] * r["count"] for r in cls) / max(
                sum(r["count"] for r in cls), 1e-12)
            base["count"] = sum(r["count"] for r in cls) / n
            base["seconds"] = max(r["seconds"] for r in cls)
            out.append(CollectiveSeen(**base))
    return out


def _gather_max(local: dict[str, dict]) -> tuple[dict[str, dict], list[dict]]:
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, local)
    merged: dict[str, dict] = {}
    for kind in local:
        m = dict(local[kind])
        for phase in ("fwd", "bwd"):
            vals = [r[kind].get(phase, 0.0) for r in everyone if kind in r]
            m[phase] = max(vals)
            m[f"per_rank_{phase}"] = tuple(vals)
        merged[kind] = m
    return merged, everyone


def _contention(built: Built, timer: LayerTimer, iters, m: int, opts: MeasureOptions,
                alone: dict, spec: RunSpec, rounds: int = 2) -> dict[str, float]:
    """Per-kind slowdown with every other core busy (CPU, fewer ranks than cores):
    ``rounds`` of (busy, alone) passes, the median ratio per kind (alternating keeps a
    drift of the machine's load out of the ratio)."""
    import os
    free = (os.cpu_count() or 1) - dist.get_world_size()
    if torch.cuda.is_available() or not opts.contention or free <= 0:
        return {}
    from primus_ext.measure.contention import busy_neighbours

    def totals(t: dict) -> dict[str, float]:
        return {k: d.get("fwd", 0.0) + d.get("bwd", 0.0) for k, d in t.items()}

    ratios: dict[str, list[float]] = defaultdict(list)
    base = totals(alone)
    for r in range(rounds):
        with busy_neighbours(free, rank_shapes(spec)):
            _run_steps(built, timer, iters, m, 1, opts.repeats, trace=False)
        busy = totals(_timings(spec, timer))
        if r > 0:
            _run_steps(built, timer, iters, m, 0, opts.repeats, trace=False)
            base = totals(_timings(spec, timer))
        for k, t1 in busy.items():
            if base.get(k, 0) > 0 and t1 > 0:
                ratios[k].append(t1 / base[k])
    timer.reset()
    # Physical range: not faster than alone, not slower than sharing every busy core
    # evenly (a larger ratio means a third party loaded the machine while timing).
    top = float(free + dist.get_world_size())
    return {k: min(max(_median(v), 1.0), top) for k, v in ratios.items()}


def measure(target: RunSpec, opts: MeasureOptions = MeasureOptions()) -> Profile:
    """Run the downscaled measurement of ``target`` on the launched processes."""
    from primus_ext.measure.microbench import run_microbenchmarks
    from primus_ext.measure.step import data_iterators

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
    down = downscale_for(target, world, hw, opts)
    timing_spec = _no_recompute(down.spec)
    built = build(timing_spec, with_optimizer=not capture)
    use_te = built.use_te
    timer = LayerTimer(built.bare()).attach()
    fits = []
    if opts.microbench and world > 1 and same:
        fits = run_microbenchmarks(built.groups, repeats=opts.microbench_repeats)

    iters = data_iterators(built)
    m = timing_spec.num_microbatches
    steps, records = _run_steps(built, timer, iters, m, opts.warmup, opts.repeats)
    local = _timings(timing_spec, timer)
    synced = _synced_records(built, timer, iters, m) if torch.cuda.is_available() else None
    contention = _contention(built, timer, iters, m, opts, local, timing_spec) if same \
        else {}
    timer.detach()

    n_layers = {k: v["n_layers"] for k, v in local.items()}
    samples = opts.repeats * m
    seen, comm_s = _collectives(timing_spec, records, n_layers, samples, opts.repeats,
                                synced)
    merged, _ = _gather_max(local)
    seen = _gather_collectives(seen)
    num_params = sum(p.numel() for c in built.model for p in c.parameters())
    # megatron-core tags expert parameters with allreduce=False.
    num_expert = sum(p.numel() for c in built.model for p in c.parameters()
                     if not getattr(p, "allreduce", True))

    act: dict[str, int] = {}
    flops: dict = {}
    if opts.count_activations:
        if down.spec.train.recompute_granularity is not None:
            del built
            teardown()
            built = build(down.spec, with_optimizer=False)
        act, flops = _activation_bytes(built, down.spec)
        act = _mean_over_ranks(act)
    del built
    teardown()
    seen += _pipeline_probe(target, timing_spec, world, warm=not capture)

    layers = {}
    for kind, d in merged.items():
        if kind == "step" or "fwd" not in d:
            continue
        layers[kind] = KindTiming(
            kind=kind, num_layers=d["n_layers"], num_samples=d.get("n_samples", 0),
            fwd_s=d["fwd"], bwd_s=d.get("bwd", 0.0), parts=d["parts"],
            comm_s=comm_s.get(kind, {}), contention=contention.get(kind, 1.0),
            activation_bytes=act.get(kind), per_rank_fwd_s=d["per_rank_fwd"],
            per_rank_bwd_s=d["per_rank_bwd"])
    step = {k: _median([s[k] for s in steps]) for k in ("step_s", "zero_grad_s", "fwd_bwd_s",
                                                   "optimizer_s")}
    step.update(num_microbatches=m, num_params_per_rank=int(num_params), capture_only=capture,
                executed_flops_per_microbatch=flops,
                num_expert_params_per_rank=int(num_expert),
                loss=steps[-1]["loss"] if steps else None,
                steps_s=[s["step_s"] for s in steps])
    shapes = rank_shapes(timing_spec)
    shapes["attention_backend"] = "flash" if use_te else "unfused"
    if shapes["precision"] == "fp8":
        shapes["precision"] = "bf16"  # no FP8 autocast in the measured run
    p = timing_spec.parallel
    notes = ["patches: " + ", ".join(patches) if patches else "patches: none (CUDA)"]
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


def downscale_for(target: RunSpec, world: int, hw: str, opts: MeasureOptions) -> Downscaled:
    """The downscaled run for ``world`` launched processes: every process takes part
    (extra ones as data-parallel replicas); overlap of DP sync is off while timing."""
    down = downscale(target, world, hw, layers_per_kind=opts.layers_per_kind,
                     num_microbatches=opts.num_microbatches)
    extra = ["parallel.overlap_grad_reduce=false", "parallel.overlap_param_gather=false"]
    rules = list(down.rules) + ["overlap: DP grad/param overlap off while timing layers"]
    if down.world_size != world:
        if world % down.world_size:
            raise ValueError(f"{world} processes cannot run the downscaled layout of "
                             f"{down.world_size} ranks; launch a multiple of it")
        dp = world // (down.spec.parallel.tp * down.spec.parallel.cp)
        t = down.spec.train
        extra += [f"cluster.gpus_per_node={world}",
                  f"train.global_batch_size={t.micro_batch_size * dp * opts.num_microbatches}"]
        rules.append(f"dp: {world} processes launched; the extra ones run as data-parallel "
                     "replicas")
    spec = apply_overrides(down.spec, extra)
    return dataclasses.replace(down, spec=spec, overrides=down.overrides + tuple(extra),
                               rules=tuple(rules), world_size=world)
