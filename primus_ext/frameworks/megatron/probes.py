"""The passes of a measurement: timed steps with the hooks on, a device-synced trace
(CUDA), the busy-node contention (CPU), the two-stage pipeline probe, and the one
forward+backward that counts saved activations and executed FLOPs.
"""
from __future__ import annotations

from collections import defaultdict

import torch
import torch.distributed as dist

from primus_ext.measure.aggregate import _kind_of, _median
from primus_ext.frameworks.megatron.build import Built, build, teardown
from primus_ext.project.profile import rank_shapes
from primus_ext.measure.hooks import LayerTimer
from primus_ext.presets.overrides import apply_overrides
from primus_ext.project.profile import CollectiveSeen
from primus_ext.spec import RunSpec


def _run_steps(built: Built, timer: LayerTimer, iters, m: int, warmup: int, repeats: int,
               trace: bool = True, progress=None) -> tuple[list[dict], list]:
    """Warm-up then timed steps with the hooks on; (step results, traced records).
    ``progress`` (measure/progress.py): each step, and the first one layer by layer."""
    from primus_ext.frameworks.megatron.step import train_step
    from primus_ext.measure.progress import layer_hooks
    from primus_ext.measure.tracer import get_tracer
    tracer = get_tracer()
    tracer.scope_fn = timer.scope
    steps = []
    n = warmup + repeats
    try:
        for it in range(n):
            if it == warmup:
                timer.reset()
                tracer.clear()
            timer.enabled = True
            tracer.enabled = trace
            remove = None
            if progress is not None:
                label = (f"warmup step {it + 1} of {warmup}" if it < warmup else
                         f"timed step {it - warmup + 1} of {repeats}")
                progress.say(f"{label} ({m} microbatch(es))")
                if it == 0:
                    remove = layer_hooks(built.bare().decoder.layers, progress, label)
            try:
                r = train_step(built, iters, m)
            finally:
                if remove is not None:
                    remove()
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


def _pipeline_probe(target: RunSpec, spec: RunSpec, world: int, warm: bool = True,
                    steps: int = 6) -> tuple[list[CollectiveSeen], dict]:
    """When the target pipelines and two stages fit the launched processes: a two-stage
    pipeline, each stage holding the measured layers, run in megatron-core's own 1F1B
    schedule (``forward_backward_pipelining_without_interleaving``), to capture the p2p
    sends and to time the pipeline in situ.

    Returns (the p2p sends seen, the probe): ``{"overrides": the probe run's spec,
    "num_microbatches", "fwd_bwd_s": the schedule's time per step (the median over
    ``steps`` timed steps, the slowest rank, its gradient sync left out), "layers": kind ->
    {"fwd", "bwd"} per layer and microbatch timed by hooks there (the mean over the
    stages)}``. The projector takes a pipeline target's layer times from the probe and
    adds what the schedule took beyond them to every pipeline p2p
    (``project/pipeline_insitu.py``). Empty dict when not timed (capture only)."""
    from primus_ext.frameworks.megatron.step import data_iterators
    from primus_ext.measure.aggregate import _timings
    from primus_ext.measure.tracer import get_tracer
    from primus_ext.presets.overrides import spec_overrides
    p = spec.parallel
    inner = p.tp * p.cp
    if target.parallel.pp == 1 or world % (2 * inner):
        return [], {}
    dp = world // (2 * inner)
    t = spec.train
    # Steady state needs microbatches beyond 1F1B's warm-up (pp - 1 = 1); as many as the
    # target's, up to 8.
    m = min(max(target.num_microbatches, 4), 8) if warm else 2
    probe = apply_overrides(spec, ["parallel.pp=2", f"train.global_batch_size="
                                   f"{t.micro_batch_size * dp * m}",
                                   f"model.num_layers={2 * spec.model.num_layers}"])
    teardown()
    built = build(probe, with_optimizer=warm)
    tracer = get_tracer()
    info: dict = {}
    if warm:
        timer = LayerTimer(built.bare()).attach(parts=False)
        timed, _ = _run_steps(built, timer, data_iterators(built), m, 1, steps,
                              trace=False)
        local = _timings(probe, timer)
        timer.detach()
        mine = (_median([r["fwd_bwd_s"] - r["finalize_s"] for r in timed]),
                {k: {ph: v[ph] for ph in ("fwd", "bwd") if ph in v}
                 for k, v in local.items() if k != "step"})
        everyone_t = [None] * dist.get_world_size()
        dist.all_gather_object(everyone_t, mine)
        layers: dict[str, dict[str, float]] = {}
        for kind in {k for _, d in everyone_t for k in d}:
            for ph in ("fwd", "bwd"):
                vals = [d[kind][ph] for _, d in everyone_t if ph in d.get(kind, {})]
                if vals:
                    layers.setdefault(kind, {})[ph] = sum(vals) / len(vals)
        info = {"overrides": spec_overrides(probe), "num_microbatches": m,
                "fwd_bwd_s": max(x for x, _ in everyone_t), "steps": steps,
                "layers": layers}
    timer = LayerTimer(built.bare())  # not attached: only the scope function
    _, records = _run_steps(built, timer, data_iterators(built), m, 0, 1)
    teardown()
    sends = [(r.in_bytes, r.seconds) for r in records if r.collective == "p2p" and r.in_bytes]
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, sends)
    sends = [x for rows in everyone for x in rows]
    if not sends:
        return [], info
    per_send = _median([b for b, _ in sends])
    return [CollectiveSeen(kind="pipeline", part="p2p", op="batch_isend_irecv",
                           collective="p2p", axis="pp", phase="step", group_size=2,
                           num_bytes=per_send, count=len(sends) / world / m,
                           seconds=_median([x for _, x in sends]),
                           dtype=str(t.precision))], info


def _activation_bytes(built: Built, spec: RunSpec) -> tuple[dict[str, int], dict]:
    """Saved-for-backward bytes per kind, per layer per microbatch (one forward), and the
    executed FLOPs the ops of that microbatch performed (``FlopCounterMode``): forward
    FLOPs per layer kind and the forward+backward total. Backward FLOPs are counted in
    total only: autograd runs them outside the modules' hooks."""
    from torch.utils.flop_counter import FlopCounterMode

    from primus_ext.measure.saved_tensors import SavedTensorCounter, gpt_scopes
    from primus_ext.frameworks.megatron.step import data_iterators, forward_step
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


def _step_means(spec: RunSpec, timer: LayerTimer) -> dict[str, list[float]]:
    """kind -> per step, the mean fwd+bwd time of the kind's layers and microbatches."""
    acc: dict[tuple[str, str], dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for (scope, phase), steps in timer.per_step.items():
        kind, part = _kind_of(spec, scope)
        if part != "layer" or phase not in ("fwd", "bwd"):
            continue
        for k, xs in enumerate(steps):
            acc[(kind, phase)][k].extend(xs)
    out: dict[str, list[float]] = {}
    for (kind, phase), steps in acc.items():
        means = [sum(xs) / len(xs) for _, xs in sorted(steps.items()) if xs]
        prev = out.get(kind)
        out[kind] = [a + b for a, b in zip(prev, means)] if prev else means
    return out


def _contention(built: Built, timer: LayerTimer, iters, m: int, opts,
                alone: dict, spec: RunSpec, rounds: int = 6, steps: int = 2
                ) -> dict[str, float]:
    """Per-kind slowdown with every other core busy (CPU, fewer ranks than cores).

    Each other core runs a neighbour training the same model (``contention.py``),
    started once and paused / resumed: ``rounds`` of alternating (busy, quiet) passes of
    ``steps`` steps, the ratio of the medians of the per-step means. On a VM the
    slowdown changes with how the host maps the virtual cores (shared or separate
    physical cores), so it is sampled over the whole window, as a real run lives it."""
    import os
    free = (os.cpu_count() or 1) - dist.get_world_size()
    if torch.cuda.is_available() or not opts.contention or free <= 0:
        return {}
    from primus_ext.frameworks.megatron.contention import busy_neighbours

    busy: dict[str, list[float]] = defaultdict(list)
    base: dict[str, list[float]] = defaultdict(list)
    with busy_neighbours(free, rank_shapes(spec), spec) as nb:
        for _ in range(rounds):
            nb.resume()
            _run_steps(built, timer, iters, m, 0, steps, trace=False)
            for k, v in _step_means(spec, timer).items():
                busy[k] += v
            nb.pause()
            _run_steps(built, timer, iters, m, 0, steps, trace=False)
            for k, v in _step_means(spec, timer).items():
                base[k] += v
    timer.reset()
    # Physical range: not faster than alone, not slower than sharing every busy core
    # evenly.
    top = float(free + dist.get_world_size())
    return {k: min(max(_median(busy[k]) / _median(base[k]), 1.0), top)
            for k in busy if base.get(k) and _median(base[k]) > 0}
