"""The body of ``launch/torchtitan_train.py`` (a drop-in for ``-m torchtitan.train``).

``torchrun ... launch/torchtitan_train.py <torchtitan flags> [--project-only ...]``:

- with ``--project-only``: the line is read as torchtitan would read it
  (``flags.parse_titan``) and projected on the target (``--target-nodes``,
  ``--target-gpus-per-node``, ``--target-hardware``) by ``--projection-backend``:
  ``simulate`` (the analytic model, rank 0 only) or ``hybrid`` (a measured downscaled
  torchtitan run: ``primus_ext.frameworks.torchtitan.measure.run_measurement(spec,
  titan_argv)``, run by every local rank, returning the Profile (or an Estimate), which
  rank 0 projects to the target). Without the
  flag the hybrid backend is used when that module is installed, else simulate. Rank 0
  prints the projection and writes ``--projection-out`` (the Estimate JSON with a
  ``config`` dict: framework, model, parallel, train, cluster);
- without it: runs ``torchtitan.train`` itself with the same arguments.
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import sys

from primus_ext.measure.plan import MeasurementDoesNotFit

OWN_HELP = {
    "--project-only": "project the step on the target instead of training",
    "--projection-backend": "simulate | hybrid (default: hybrid when installed)",
    "--target-nodes": "nodes of the target cluster",
    "--target-gpus-per-node": "GPUs per target node (default: the hardware's)",
    "--target-hardware": "hardware preset of the target (default h100)",
    "--projection-out": "write the Estimate JSON here",
    "--measure-memory-gib": "hybrid: memory the measurement may use on this machine "
                            "(default: half the free memory, at most 6 GiB)",
    "--measure-max-seconds": "hybrid: estimated compute the measurement may take "
                             "(default 150)",
}
MEASURE_MODULE = "primus_ext.frameworks.torchtitan.measure"


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


def split_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """Own flags out of ``argv``; the rest is torchtitan's line, in order."""
    p = argparse.ArgumentParser(prog="torchtitan_train.py", add_help=False)
    p.add_argument("--project-only", action="store_true")
    p.add_argument("--projection-backend", choices=("simulate", "hybrid"), default=None)
    p.add_argument("--target-nodes", type=int, default=None)
    p.add_argument("--target-gpus-per-node", type=int, default=None)
    p.add_argument("--target-hardware", default="h100")
    p.add_argument("--projection-out", default=None)
    p.add_argument("--measure-memory-gib", type=float, default=None)
    p.add_argument("--measure-max-seconds", type=float, default=None)
    own, rest = p.parse_known_args(argv)
    for flag in ("measure_memory_gib", "measure_max_seconds"):
        v = getattr(own, flag)
        if v is not None and not v > 0:
            raise ValueError(f"--{flag.replace('_', '-')}={v} must be > 0")
    if own.target_nodes is not None and own.target_nodes < 1:
        raise ValueError(f"--target-nodes={own.target_nodes} must be >= 1")
    if own.target_gpus_per_node is not None and own.target_gpus_per_node < 1:
        raise ValueError(f"--target-gpus-per-node={own.target_gpus_per_node} must be >= 1")
    return own, rest


def target_spec(own: argparse.Namespace, titan: list[str]):
    """The RunSpec the line means on the target cluster, and the parsed line."""
    from primus_ext.config import compose
    from primus_ext.frameworks.torchtitan.flags import parse_titan, to_overrides
    from primus_ext.presets import hardware_preset, model_preset
    ta = parse_titan(titan)
    hw = hardware_preset(own.target_hardware)
    gpn = own.target_gpus_per_node or hw.gpus_per_node
    nodes = own.target_nodes or 1
    layers = int(model_preset(ta.registry.model)["num_layers"])
    ov = to_overrides(ta, layers, nodes * gpn)
    ov += [f"cluster.hardware={own.target_hardware}", f"cluster.num_nodes={nodes}",
           f"cluster.gpus_per_node={gpn}"]
    return compose(ov), ta


def config_dict(spec) -> dict:
    """The ``config`` part of the projection JSON."""
    from primus_ext.util.values import json_safe
    c = spec.cluster
    return {"framework": spec.framework, "model": json_safe(dataclasses.asdict(spec.model)),
            "parallel": json_safe(dataclasses.asdict(spec.parallel)),
            "train": json_safe(dataclasses.asdict(spec.train)),
            "cluster": {"hardware": c.hardware.name, "num_nodes": c.num_nodes,
                        "gpus_per_node": c.node_size, "world_size": spec.world_size}}


def _backend(own: argparse.Namespace) -> str:
    have = importlib.util.find_spec(MEASURE_MODULE) is not None
    if own.projection_backend == "hybrid" and not have:
        raise ValueError(f"--projection-backend hybrid needs {MEASURE_MODULE} (the "
                         "torchtitan measurement), which is not installed here; use "
                         "--projection-backend simulate")
    return own.projection_backend or ("hybrid" if have else "simulate")


def project_only(own: argparse.Namespace, titan: list[str]) -> dict:
    spec, ta = target_spec(own, titan)
    backend = _backend(own)
    if backend == "hybrid":
        import importlib
        measure = importlib.import_module(MEASURE_MODULE)
        opts = measure.TitanMeasureOptions(memory_gib=own.measure_memory_gib,
                                           max_seconds=own.measure_max_seconds)
        result = measure.run_measurement(spec, titan, opts)  # every local rank measures
        if _rank() != 0 or result is None:
            return {}
        est, prov = result, None
        if not hasattr(result, "step_time_s"):  # a Profile: restore the target from it
            from primus_ext.measure.provenance import provenance
            from primus_ext.project.from_profile import project_from_profile
            est = project_from_profile(result, spec)
            prov = provenance(result, spec)
    else:
        if _rank() != 0:
            return {}
        from primus_ext.project.estimate import project
        est, prov = project(spec), None
    from primus_ext.modes.project import print_estimate
    print_estimate(spec, est)
    if prov is not None:  # what was measured, what simulated, what the downscale left out
        from primus_ext.measure.provenance import provenance_lines
        for line in provenance_lines(prov):
            print(line)
    print(f"backend: {backend}; framework: torchtitan ({ta.registry.module}/"
          f"{ta.registry.config}); target {spec.world_size} x "
          f"{spec.cluster.hardware.name}")
    if ta.ignored:
        print("no effect on step time or memory: " + " ".join(ta.ignored))
    if ta.not_modelled:
        print("warning: not modelled (ignored): " + " ".join(ta.not_modelled))
    out = est.to_dict()
    out["config"] = config_dict(spec)
    if own.projection_out:
        from primus_ext.util.files import atomic_write_text
        atomic_write_text(own.projection_out, json.dumps(out, indent=1) + "\n",
                          "--projection-out")
        print(f"projection written to {own.projection_out}")
    return out


def train(titan: list[str]) -> None:
    """Run torchtitan's own trainer with the same arguments."""
    if importlib.util.find_spec("torchtitan") is None:
        raise ValueError("torchtitan is not installed: pip install "
                         "'primus-ext[torchtitan]' "
                         "(or add --project-only)")
    import runpy
    sys.argv = ["torchtitan.train"] + titan
    runpy.run_module("torchtitan.train", run_name="__main__", alter_sys=True)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--help" in argv or "-h" in argv:
        from primus_ext.frameworks.torchtitan.flags import FLAGS, NO_EFFECT
        print(__doc__)
        print("modelled torchtitan flags: " + " ".join(f.flag for f in FLAGS)
              + " activation-checkpoint:{none,selective,full}")
        print("no effect on step time or memory: " + " ".join(NO_EFFECT))
        for k, v in OWN_HELP.items():
            print(f"  {k}: {v}")
        return 0
    try:
        own, titan = split_args(argv)
        from primus_ext.util.files import check_outputs
        check_outputs({"--projection-out": own.projection_out})
        if own.project_only:
            project_only(own, titan)
        else:
            train(titan)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except MeasurementDoesNotFit as exc:
        if _rank() == 0:
            print(str(exc), file=sys.stderr, flush=True)
        return 3
    return 0
