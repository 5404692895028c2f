"""mode=train: a short real training run of the recipe's own line, beside its projection.

The composed spec's ``megatron_args.sh`` line (frameworks/megatron/flags.py
``megatron_argv``, ``--train-iters`` set to ``train_iters``) runs under torchrun on this
machine through the drop-in's training path (``launch/pretrain_gpt.py`` without
``--project-only``: megatron-core with the line's layout, mock data), with the environment
the recipe exports. Its median steady-state iteration time and memory are read back and
set beside the projection of the same spec, with the error.

Only a job whose cluster is this machine runs: one node of the hardware found here (the
``cpu`` preset with gloo on a CPU machine). Any other returns ``verdict: not run`` with
the reason (on a cluster, launch ``megatron_args.sh`` itself).

This is the validation job of ``hydra.sweeper.validate_top_k``.
"""
from __future__ import annotations

import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from primus_ext.config import spec_and_notes
from primus_ext.emit.console import print_json, print_table

GIB = 2**30
DEFAULT_ITERS = 4  # two warm-up iterations, the rest timed (launch.train: steps[2:])


def recipe_line(spec, iters: int) -> list[str]:
    """The recipe's Megatron-LM flags with ``--train-iters`` set to ``iters``."""
    from primus_ext.frameworks.megatron.flags import megatron_argv
    argv = megatron_argv(spec)
    i = argv.index("--train-iters")
    return argv[:i + 1] + [str(iters)] + argv[i + 2:]


def _here() -> str:
    from primus_ext.frameworks.megatron.runner import local_hardware
    return local_hardware()


def why_not_here(spec) -> str | None:
    """None when the spec's cluster is this machine, else why it cannot run here."""
    c = spec.cluster
    if spec.framework != "megatron":
        return f"framework={spec.framework}: mode=train runs Megatron-LM lines"
    if c.num_nodes != 1:
        return (f"the job needs {c.num_nodes} nodes; launch its megatron_args.sh on the "
                "cluster")
    here = _here()
    if c.hardware.name != here:
        return (f"the job is for {c.hardware.name}; this machine has {here} (launch its "
                "megatron_args.sh where that hardware is)")
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train_line(spec, iters: int, timeout_s: float) -> dict:
    """Run the recipe's line for ``iters`` iterations on this node; the drop-in's
    timings (median steady-state step) and the ranks' peak memory."""
    from primus_ext.spec.legal_megatron import args_of_spec, required_env
    root = Path(__file__).resolve().parents[2]
    with tempfile.TemporaryDirectory(prefix="primus-train-") as tmp:
        out = Path(tmp) / "timings.json"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1",
               "--nproc-per-node", str(spec.cluster.node_size), "--master-addr",
               "127.0.0.1", "--master-port", str(_free_port()),
               str(root / "launch" / "pretrain_gpt.py"), *recipe_line(spec, iters),
               "--timings-out", str(out)]
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(
            [str(root)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                           if p]))
        env.update(required_env(args_of_spec(spec.model, spec.parallel, spec.train)))
        before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        res = subprocess.run(cmd, env=env, capture_output=True, text=True,
                             timeout=timeout_s)
        rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
        if res.returncode != 0 or not out.is_file():
            tail = (res.stderr or res.stdout)[-1500:]
            raise RuntimeError(f"the recipe's line failed (exit {res.returncode}): {tail}")
        timings = json.loads(out.read_text())
    return {"median_step_s": timings["median_step_s"],
            "device_peak_bytes": timings.get("max_memory_allocated_bytes"),
            "host_rss_bytes": rss if rss > before * 1024 else None,
            "iterations": len(timings.get("steps", ())), "command": cmd}


def run(cfg) -> dict:
    spec, _ = spec_and_notes(cfg)
    from primus_ext.project.estimate import project
    est = project(spec, calibration=cfg.get("calibration", "default"))
    proj = {"step_time_s": est.step_time_s, "tokens_per_s_per_gpu": est.tokens_per_s_per_gpu,
            "peak_memory_bytes": est.memory.peak_bytes}
    out = {"mode": "train", "projected": proj}
    reason = why_not_here(spec)
    if reason is not None:
        out.update(verdict="not run", reason=reason)
    else:
        m = train_line(spec, int(cfg.get("train_iters") or DEFAULT_ITERS),
                       float(cfg.get("train_timeout_s") or 900))
        step = m["median_step_s"]
        peak = m["device_peak_bytes"] or m["host_rss_bytes"]
        out.update(verdict="measured", step_time_s=step,
                   tokens_per_s_per_gpu=spec.tokens_per_step / step / spec.world_size,
                   peak_memory_bytes=peak,
                   memory_source=("torch.cuda.max_memory_allocated"
                                  if m["device_peak_bytes"] else
                                  "largest rank's host RSS (CPU run: includes the "
                                  "Python and torch runtime)"),
                   step_time_error=step / proj["step_time_s"] - 1.0,
                   iterations=m["iterations"], command=" ".join(m["command"]))
    if cfg.get("output", "table") == "json":
        print_json(out)
    else:
        rows = [["projected step (s)", proj["step_time_s"]],
                ["measured step (s)", out.get("step_time_s", out.get("reason"))]]
        if "step_time_error" in out:
            rows.append(["error", f"{out['step_time_error']:+.1%}"])
        print_table(f"{spec.model.name}: the recipe's line, trained", ["", "value"], rows)
    return out
