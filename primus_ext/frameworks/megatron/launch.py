"""The body of ``launch/pretrain_gpt.py`` (a drop-in for Megatron-LM's script).

``torchrun ... launch/pretrain_gpt.py <Megatron-LM flags>``:

- with ``--project-only --projection-backend simulate``: the parsed launch line is
  projected analytically (the simulate backend; no torch, no measurement, about a
  second), on one process;
- with ``--project-only`` (``--projection-backend hybrid``, the default): every local
  rank runs the downscaled measurement of the target (``--target-nodes``,
  ``--target-gpus-per-node``, ``--target-hardware``); rank 0 prints the projection, says
  which parts were measured and which simulated, checks the captured collectives and
  activations against the models, and writes the profile (``--profile-out``, else
  ``primus_ext_profile.json`` in the run directory $PRIMUS_EXT_HOME/runs/<id>/);
- either way ``--projection-out`` (JSON: the Estimate plus ``config``, the composed
  configuration that was projected, by Hydra group) and ``--recipe-out DIR`` (Hydra
  overrides and the Megatron-LM torchrun line);
- without ``--project-only``: trains the megatron-core model on synthetic tokens for
  ``--train-iters`` and logs one line per iteration on rank 0 (``--timings-out FILE``
  keeps them as JSON), so a projection can be compared with a real run.
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys

from primus_ext.frameworks.megatron.args import parse_launch_args, warning_lines


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


def _say(*args) -> None:
    if _rank() == 0:
        print(*args, flush=True)


def _run_spec(target, world: int, local: int, hw: str):
    """The run on the launched processes: the target's model and layout, this cluster."""
    from primus_ext.presets.overrides import apply_overrides
    nodes = max(world // max(local, 1), 1)
    return apply_overrides(target, [f"cluster.hardware={hw}", f"cluster.num_nodes={nodes}",
                                    f"cluster.gpus_per_node={world // nodes}"])


def train(la) -> dict:
    import torch.distributed as dist

    from primus_ext.frameworks.megatron.build import build, init_distributed
    from primus_ext.frameworks.megatron.runner import local_hardware
    from primus_ext.frameworks.megatron.step import data_iterators, train_step
    from primus_ext.measure.budget import resident_bytes
    rank, world = init_distributed()
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    spec = _run_spec(la.spec, world, local, local_hardware())
    rss0 = resident_bytes()
    built = build(spec)
    iters = data_iterators(built)
    m = spec.num_microbatches
    p = spec.parallel
    _say(f"primus-ext: training {spec.model.name} for {la.train_iters} iterations on "
         f"{world} x {spec.cluster.hardware.name}: TP{p.tp} PP{p.pp} VPP{p.vpp} CP{p.cp} "
         f"EP{p.ep} DP{spec.dp}, {m} microbatches of {spec.train.micro_batch_size} x "
         f"{spec.train.seq_length}")
    timer = None
    if la.layer_times:  # the measurement's hooks in a real run (compare with a profile)
        from primus_ext.measure.hooks import LayerTimer
        timer = LayerTimer(built.bare()).attach()
        timer.enabled = True
    steps = []
    for it in range(1, la.train_iters + 1):
        if timer is not None and it == 3:
            timer.reset()
        r = train_step(built, iters, m)
        if timer is not None:
            timer.collect()
        r["loss"] = _loss_everywhere(r["loss"])  # only the last stage computes it
        steps.append(r)
        tok = spec.tokens_per_step / r["step_s"] / world
        _say(f" iteration {it:>5}/{la.train_iters} | step time (ms): {r['step_s'] * 1e3:.1f}"
             f" | fwd-bwd (ms): {r['fwd_bwd_s'] * 1e3:.1f} | optimizer (ms): "
             f"{r['optimizer_s'] * 1e3:.1f} | tokens/s/GPU: {tok:.1f} | lm loss: "
             f"{r['loss']:.4f}")
    steady = sorted(s["step_s"] for s in steps[2:] or steps)
    median = steady[len(steady) // 2] if steady else float("nan")
    _say(f"primus-ext: median steady-state step time (s): {median:.6f}")
    if timer is not None:
        med = timer.medians()
        for key in sorted(med):
            print(f"  rank {rank} {key[0]} {key[1]}: {med[key] * 1e3:.3f} ms", flush=True)
    out = {"spec": dataclasses.asdict(spec.parallel), "world": world, "median_step_s": median,
           "steps": steps, "max_memory_allocated_bytes": _max_allocated()}
    if out["max_memory_allocated_bytes"] is None:
        out["rss_growth_bytes"] = _rss_growth(rss0)
    dist.barrier()
    return out


def _max_allocated() -> int | None:
    """torch.cuda.max_memory_allocated, the largest over ranks (None on a CPU)."""
    import torch
    import torch.distributed as dist
    if not torch.cuda.is_available():
        return None
    t = torch.tensor([torch.cuda.max_memory_allocated()], dtype=torch.float64).cuda()
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def _rss_growth(rss0: int) -> int:
    """On a CPU, which keeps no allocator statistics: the growth of the resident set
    since before the build, the largest over ranks (a proxy: it also holds the
    allocator's cached pages and what the first steps load)."""
    import resource

    import torch
    import torch.distributed as dist
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    t = torch.tensor([max(peak - rss0, 0)], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def _loss_everywhere(loss: float) -> float:
    import math

    import torch
    import torch.distributed as dist
    t = torch.tensor([-math.inf if math.isnan(loss) else loss], dtype=torch.float64)
    if torch.cuda.is_available():
        t = t.cuda()
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def run_dir() -> str:
    """This launch's run directory: $PRIMUS_EXT_HOME (else ~/.cache/primus-ext) /runs/
    <PRIMUS_EXT_RUN_ID, else a timestamp>, as the CLI's Hydra runs (hydra_conf)."""
    import time
    home = os.environ.get("PRIMUS_EXT_HOME") or os.path.join(
        os.environ.get("HOME", "/tmp"), ".cache", "primus-ext")
    run_id = os.environ.get("PRIMUS_EXT_RUN_ID") or time.strftime(
        "%Y-%m-%d_%H-%M-%S") + f"-pretrain_gpt-{os.getpid()}"
    return os.path.join(home, "runs", run_id)


def _outputs(la, est, profile_path: str | None, measurement: dict | None = None) -> dict:
    """Write --projection-out (the Estimate, the configuration it projected and, for
    hybrid, ``measurement``: what was measured and what modelled) and --recipe-out;
    returns the JSON object."""
    from primus_ext.presets.overrides import spec_config
    from primus_ext.util.files import atomic_write_text
    out = est.to_dict()
    out["config"] = spec_config(la.spec)
    if measurement is not None:
        out["measurement"] = measurement
    if la.projection_out:
        atomic_write_text(la.projection_out, json.dumps(out, indent=1) + "\n",
                          "--projection-out")
        print(f"projection written to {la.projection_out}")
    if la.recipe_out:
        _write_recipe(la, profile_path)
    return out


def simulate_only(la) -> dict:
    """--projection-backend simulate: the analytic projection of the launch line."""
    from primus_ext.modes.project import print_estimate
    from primus_ext.project.estimate import project
    est = project(la.spec)
    print_estimate(la.spec, est)
    for line in est.notes:
        print("  note: " + line)
    return _outputs(la, est, None)


def project_only(la, argv: list[str]) -> dict:
    from primus_ext.measure.checks import activation_check, collective_check, flops_check, \
        format_rows, p2p_check
    from primus_ext.frameworks.megatron.runner import MeasureOptions, measure
    from primus_ext.measure.progress import Progress
    from primus_ext.measure.provenance import provenance, provenance_lines
    from primus_ext.project.from_profile import project_from_profile
    opts = MeasureOptions(warmup=la.measure_warmup, repeats=la.measure_repeats,
                          num_microbatches=la.num_microbatches,
                          layers_per_kind=la.layers_per_kind,
                          memory_gib=la.measure_memory_gib,
                          max_seconds=la.measure_max_seconds,
                          target_overrides=tuple(argv))
    prog = Progress(enabled=_rank() == 0)
    profile = measure(la.spec, opts)
    if _rank() != 0:
        return {}
    with prog.step("projection: the target from the profile"):
        est = project_from_profile(profile, la.spec)
    path = la.profile_out or os.path.join(run_dir(), "primus_ext_profile.json")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    profile.save(path)
    from primus_ext.modes.project import print_estimate
    print_estimate(la.spec, est)
    prov = provenance(profile, la.spec)
    for line in provenance_lines(prov):
        print(line)
    for line in est.notes:
        print("  note: " + line)
    rows = collective_check(profile, la.spec) + activation_check(profile, la.spec) \
        + p2p_check(profile, la.spec) + flops_check(profile, la.spec)
    if rows:
        print("captured vs models (the measured layout):")
        for line in format_rows(rows):
            print("  " + line)
    print(f"profile written to {path}")
    return _outputs(la, est, path, measurement=prov)


def _write_recipe(la, profile_path: str | None) -> None:
    from pathlib import Path

    from primus_ext.frameworks.megatron.flags import torchrun_script
    from primus_ext.presets.overrides import spec_overrides
    from primus_ext.util.files import atomic_write_text
    out = Path(la.recipe_out)
    ovs = spec_overrides(la.spec)
    if profile_path:
        ovs += ["backend=profile", f"profile={profile_path}"]
    atomic_write_text(out / "overrides.txt", "\n".join(ovs) + "\n")
    atomic_write_text(out / "megatron_args.sh",
                      torchrun_script(la.spec, "primus-ext --project-only target"))
    print(f"recipe written to {out}/ (overrides.txt, megatron_args.sh)")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        la = parse_launch_args(argv)  # pure: --help and errors need no torch
    except ValueError as exc:
        print(f"pretrain_gpt.py: error: {exc}", file=sys.stderr)
        return 2
    if _rank() == 0:
        for line in [f"primus-ext: {n}" for n in la.notes] + warning_lines(la):
            print(line, file=sys.stderr, flush=True)
        if la.project_only and la.target_note:
            print(f"primus-ext: {la.target_note}", file=sys.stderr, flush=True)
    if la.project_only and la.projection_backend == "simulate":
        if _rank() == 0:  # analytic: one process answers, no torch
            simulate_only(la)
        return 0
    from primus_ext.frameworks.megatron.build import prepare_runtime
    prepare_runtime()  # the collective tracer goes in before megatron.core is imported
    timings_out = la.timings_out
    if la.project_only:
        from primus_ext.frameworks.megatron.runner import MeasurementDoesNotFit
        try:
            project_only(la, argv)
        except MeasurementDoesNotFit as exc:
            if _rank() == 0:
                print(str(exc), file=sys.stderr, flush=True)
            return 3
    else:
        out = train(la)
        if timings_out and _rank() == 0:
            from primus_ext.util.files import atomic_write_text
            atomic_write_text(timings_out, json.dumps(out, indent=1) + "\n")
    import torch.distributed as dist
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0
