"""mode=measure: measure a downscaled real megatron-core (or torchtitan) run of the
composed target on the local device(s) and save its Profile.

    primus-ext mode=measure model=llama3.1_8b parallel.tp=8 cluster.num_nodes=4 \\
        profile=llama8b.profile.json
    torchrun --nproc-per-node 2 -m primus_ext.cli mode=measure ... profile=p.json

Before anything large is allocated, a plan (``measure/plan.py``) applies the memory
model to the downscaled run on this device and shrinks it until it fits (microbatches,
optimizer, layers, vocabulary slice, sequence; each step is a rule in the profile); if
nothing fits it prints one line saying what it would need and exits (status 3): use
``mode=project`` (the analytic backend) instead. Progress goes to stderr with elapsed
times: the plan, build, warmup, layer k of n, collectives, activations.
``+measure.help=true`` prints these options and exits.

Options (optional keys, ``+measure.KEY=VALUE``):

- ``warmup`` (2): untimed steps before timing (same hardware as the target);
- ``repeats`` (3): timed steps; the median per layer kind is kept;
- ``num_microbatches`` (2): microbatches per measured step (the plan may take 1);
- ``layers_per_kind`` (2): decoder layers of each kind built (the plan may take 1);
- ``microbench`` (true): collective microbenchmarks on the process groups (2+ ranks);
- ``microbench_repeats`` (5): repeats of each microbenchmark size;
- ``count_activations`` (true): one forward with the saved-tensor counter and FLOP count;
- ``contention`` (true): on a CPU, time again with the other cores busy;
- ``local_hardware`` (detected): the measuring device's preset (cpu, h100, ...);
- ``memory_gib`` (device's): the memory budget (CPU: all local processes together,
  default half of MemAvailable, at most 6 GiB; GPU: per device, 90% of its free memory);
- ``max_seconds`` (150 on a CPU, 300 on a GPU): the estimated compute budget.

With ``framework=torchtitan`` the run measured is torchtitan's own Trainer on the line
the spec stands for (``frameworks/torchtitan/measure.py``), planned the same way; it takes
``warmup``, ``repeats``, ``num_microbatches``, ``layers_per_kind``, ``contention``,
``memory_gib`` and ``max_seconds``.

The profile goes to ``profile=`` or, when that is null, to ``profile.json`` in the run
directory. Then: ``mode=project backend=profile profile=FILE``.
"""
from __future__ import annotations

import os

from primus_ext.config import spec_from_cfg
from primus_ext.emit.console import print_json, print_table

OPTION_KEYS = ("warmup", "repeats", "num_microbatches", "layers_per_kind", "microbench",
               "microbench_repeats", "count_activations", "contention", "local_hardware",
               "memory_gib", "max_seconds")


def options_help() -> str:
    doc = __doc__ or ""
    return doc[doc.index("Before anything"):].strip()


def _raw_options(cfg, known: tuple[str, ...], what: str = "") -> dict:
    """The ``+measure.KEY`` values, each one of ``known`` (one error naming the key)."""
    raw = dict(cfg.get("measure") or {})
    raw.pop("help", None)
    unknown = sorted(set(raw) - set(known))
    if unknown:
        raise ValueError(f"measure.{unknown[0]} is not a measure option{what}; known: "
                         f"{', '.join(known)}")
    return raw


def _options(cfg, overrides: tuple[str, ...]):
    from primus_ext.frameworks.megatron.runner import MeasureOptions
    return MeasureOptions(target_overrides=overrides, **_raw_options(cfg, OPTION_KEYS))


def _out_path(cfg) -> str:
    if cfg.get("profile"):
        return str(cfg.profile)
    try:
        from hydra.core.hydra_config import HydraConfig
        return os.path.join(HydraConfig.get().runtime.output_dir, "profile.json")
    except ValueError:
        return "profile.json"


def summary_rows(profile) -> list[tuple]:
    rows = [("device", f"{profile.device.get('name')} ({profile.hardware}) x "
                       f"{profile.device.get('count')}")]
    plan = next((n for n in profile.notes if n.startswith("plan: ")), None)
    if plan:
        rows.append(("measured run", plan[len("plan: "):]))
    for kind, kt in profile.layers.items():
        comm = sum(v.get("fwd", 0) + v.get("bwd", 0) for v in kt.comm_s.values())
        rows.append((f"{kind} fwd / bwd (ms)",
                     f"{kt.fwd_s * 1e3:.3f} / {kt.bwd_s * 1e3:.3f}"
                     + (f"  (comm {comm * 1e3:.3f})" if comm else "")
                     + (f"  contention x{kt.contention:.2f}" if kt.contention != 1.0 else "")))
        if kt.activation_bytes is not None and kind in ("dense", "moe"):
            rows.append((f"{kind} saved activations (B/layer)", f"{kt.activation_bytes:,}"))
    rows.append(("step (s)", f"{profile.step.get('step_s', 0):.4f} over "
                             f"{profile.step.get('num_microbatches')} microbatches"))
    for f in profile.comm_fits:
        rows.append((f"{f.collective} x{f.group_size} fit",
                     f"{f.alpha_s * 1e6:.1f} us + B / {f.gbps:.2f} GB/s"))
    return rows


# measure.* keys the torchtitan measurement takes (frameworks/torchtitan/measure.py).
TITAN_KEYS = ("warmup", "repeats", "num_microbatches", "layers_per_kind", "contention",
              "memory_gib", "max_seconds")


def _titan_measure(spec, cfg, overrides: tuple[str, ...]):
    """framework=torchtitan: the downscaled run of torchtitan's own Trainer, from the
    line the spec stands for (``flags.titan_argv``)."""
    from primus_ext.frameworks.torchtitan.flags import titan_argv
    from primus_ext.frameworks.torchtitan.measure import TitanMeasureOptions, run_measurement
    raw = _raw_options(cfg, TITAN_KEYS, " of a torchtitan run")
    return run_measurement(spec, titan_argv(spec),
                           TitanMeasureOptions(target_overrides=overrides, **raw))


def run(cfg) -> dict:
    if (cfg.get("measure") or {}).get("help"):
        print(options_help())
        return {}
    spec = spec_from_cfg(cfg)
    titan = spec.framework == "torchtitan"
    if not titan:
        from primus_ext.frameworks.megatron.build import prepare_runtime
        prepare_runtime()  # tracer before megatron.core is imported
    from primus_ext.measure.plan import MeasurementDoesNotFit

    if cfg.get("profile"):  # fail before the measurement, not after it
        from primus_ext.util.files import output_path
        output_path(cfg.profile, "profile")
    overrides = ()
    try:
        from hydra.core.hydra_config import HydraConfig
        overrides = tuple(HydraConfig.get().overrides.task)
    except ValueError:
        pass
    try:
        if titan:
            profile = _titan_measure(spec, cfg, overrides)
        else:
            from primus_ext.frameworks.megatron.runner import measure
            profile = measure(spec, _options(cfg, overrides))
    except MeasurementDoesNotFit as exc:
        import sys
        if int(os.environ.get("RANK", "0")) == 0:
            print(str(exc).replace("--projection-backend simulate", "mode=project "
                               "backend=simulate").replace(
                  "--measure-memory-gib / --measure-max-seconds",
                  "+measure.memory_gib / +measure.max_seconds"), file=sys.stderr)
        sys.exit(3)
    path = _out_path(cfg)
    import torch.distributed as dist
    rank = dist.get_rank() if dist.is_initialized() else 0
    out = {"profile": path, "rules": list(profile.rules)}
    if rank == 0:
        profile.save(path)
        if cfg.output == "json":
            print_json({**out, "layers": {k: {"fwd_s": v.fwd_s, "bwd_s": v.bwd_s}
                                          for k, v in profile.layers.items()}})
        else:
            print_table(f"measured: {spec.model.name} (downscaled)", ["quantity", "value"],
                        summary_rows(profile),
                        caption=f"profile written to {path}; rules: "
                                + "; ".join(profile.rules))
    return out
