#!/usr/bin/env python
"""CPU proof of the hybrid projection for torchtitan: measure, project, run torchtitan's
own Trainer for real.

The machine is the cluster (hardware preset ``cpu``, one node, one rank per core, gloo,
one thread per process). For every target (FSDP2 over 2 processes, TP 2, PP 2 with 1F1B),
``--rounds`` times, the script

1. measures the target's downscaled torchtitan run
   (``primus_ext.frameworks.torchtitan.measure.run_measurement``; each rank's shapes kept)
   in one process, or, for a TP target, on its TP ranks (``measure_procs``);
2. for a multi-process target, benchmarks the collectives between two processes (after a
   burst of compute, as inside a layer) and fits them to alpha-beta;
3. projects the target from the profile plus the fits (``project_from_profile``);
4. runs the target for real right after: ``torchrun -m primus_ext.frameworks.torchtitan.train``
   (torchtitan's Trainer with the CPU patches) and takes the median steady-state step;
5. prints projected and measured steps (medians over rounds) and the error; ``--write``
   writes docs/cpu-proof-torchtitan.json (raw) and docs/cpu-proof-torchtitan.md.

    .venv/bin/python scripts/cpu_proof_torchtitan.py [--write] [--quick] [--configs a,b]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from proof_common import fit_collectives, load as _load, med as _med, \
    meta as _proof_meta, run as _run, steady_steps, torchrun as _torchrun, \
    with_fits, breakdown_table, paired_error, result_table  # noqa: E402

RESULTS = ROOT / "docs" / "cpu-proof-torchtitan.json"
NOTES = """## Where the errors come from

Each phase ran under an exclusive CPU lock (no other timing or heavy work on the
machine; a sampler saw no other busy process). The machine's own speed still moves: an
earlier run of the same code 50 minutes before gave fsdp2 -5.5%, tp2 -62.1%, pp2 -2.8%
with steps 10-20% shorter on both sides.

- **FSDP2 on a CPU does not overlap (fsdp2).** FSDP2 issues its all-gathers and
  reduce-scatters with ``async_op=False`` on side streams
  (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py); a CPU has no streams, so
  each blocks its rank. The `cpu` preset says so (``collective_streams: false``) and the
  comm model exposes them whole (0.33-0.37 s of the step). Before, the hybrid path costed
  a torchtitan target's layers on its own spec, where ``parallel.fsdp`` is off, so the
  FSDP2 collectives were not charged at all (-40% on a quiet machine). What is left
  (rounds from -7% to -18%): FSDP2's copy-in / copy-out and gradient division around
  each collective (aten::copy_ was 0.10 s of a profiled 0.9 s step), not modelled.
- **PP stages sync FSDP2 once per step (pp2).** torchtitan wraps every stage in FSDP2
  (here over one rank); torch's pipeline stage turns gradient sync and resharding off
  for every microbatch but the last, and torchtitan keeps parameters gathered after
  forward under PP. The one-process measurement accumulated gradients through plain
  FSDP2 and paid a post-backward reduce per block and microbatch (2.8 ms of a 13.4 ms
  block, profiled); it now runs its microbatches as a stage does.
- **TP over DTensor (tp2), measured on its TP ranks.** A profiled real TP2 step issues
  553 collectives (144 all-gathers, 144 reduce-scatters, 265 all-reduces; 0.47 s waiting
  in ``wait_tensor``), and DTensor's Python dispatch (``PythonSubclass``) took 0.29 s of
  it: a one-process measurement of the per-rank shapes has neither, and the fits cost
  the collectives 45-62 % short. So a TP target is measured on its TP ranks (as
  ``torchrun --nproc-per-node 2 launch/torchtitan_train.py ... --project-only`` does):
  the measured block times include DTensor's dispatch, and the functional-collective
  tracer charges each collective its in-situ blocked time (issue, plus its own
  ``wait_tensor`` at DTensor's next use of the output), which the projection takes for
  every collective the measured run issued. torchtitan's loss parallelism all-reduces 3
  times per loss chunk (``ChunkedLossWrapper``, 8 chunks per microbatch:
  ``train.loss_chunks``), which the comm model now issues at those sizes.
- **Contention of a busy node.** The measurement times its blocks again with the other
  core running the same Trainer and divides the busy/quiet ratio by the passes'
  time-slicing (wall / CPU seconds): with one outside busy process the factor had gone
  from 1.02 to 1.28 (dense blocks) and 1.05 to 1.68 (embedding); corrected, 1.00 and
  1.23. On a quiet machine it is 1.00-1.05.
- **Warm-up and outside load in the real runs.** The first real steps build oneDNN
  kernels and gloo pairs (0.53-3.20 s against a steady 0.3-2.4 s); the median leaves out
  the first 3 of 20. Jumps in the earlier page's runs (tp2 1.3 to 2.1 s after step 3,
  pp2 0.39 to 0.22 s) came with a load average of 2.6-3.8 and do not recur under the
  lock: after the first 3, tp2 steps stay within 1.91-2.61 s, pp2 within 0.32-0.51 s.
"""
REGISTRY = ["--module", "llama3", "--config", "llama3_debugmodel"]
# Real-run steps left out of the median: the first ones build oneDNN kernels, grow the
# allocator's pools and open gloo's pairs (1.2-2.8 s against a steady 0.9-1.7 s on this
# machine, docs/cpu-proof-torchtitan.json); the measurement drops its first 2 likewise.
WARMUP_STEPS = 3


@dataclasses.dataclass(frozen=True)
class Config:
    name: str
    nproc: int
    overrides: tuple[str, ...]  # the target as primus-ext overrides
    flags: tuple[str, ...]  # the same target as torchtitan flags
    what: str


def _dims(quick: bool) -> dict:
    h = 128 if quick else 256
    return {"num_layers": 2 if quick else 4, "hidden_size": h, "num_attention_heads": 4,
            "num_query_groups": 2, "ffn_hidden_size": 2 * h, "vocab_size": 512}


def _model_overrides(d: dict, seq: int) -> list[str]:
    return [f"model.num_layers={d['num_layers']}", f"model.hidden_size={d['hidden_size']}",
            f"model.num_attention_heads={d['num_attention_heads']}",
            f"model.num_query_groups={d['num_query_groups']}",
            f"model.ffn_hidden_size={d['ffn_hidden_size']}",
            f"model.vocab_size={d['vocab_size']}", f"train.seq_length={seq}",
            "cluster.hardware=cpu", "cluster.num_nodes=1", "cluster.gpus_per_node=2"]


def configs(quick: bool) -> list[Config]:
    d = _dims(quick)
    seq = 128 if quick else 256
    m = 4 if quick else 8  # microbatches per step and data-parallel rank
    base = ["framework=torchtitan", "model=tiny_dense"] + _model_overrides(d, seq)
    tt = ["--training.seq_len", str(seq)]
    return [
        Config("fsdp2", 2, tuple(base + ["parallel.dp_shard=2", "train.micro_batch_size=1",
                                         f"train.global_batch_size={2 * m}"]),
               tuple(tt + ["--parallelism.data_parallel_shard_degree", "2",
                           "--training.local_batch_size", "1",
                           "--training.global_batch_size", str(2 * m)]),
               f"FSDP2 over 2 processes, {m} accumulated microbatches"),
        Config("tp2", 2, tuple(base + ["parallel.dp_shard=1", "parallel.tp=2",
                                       "parallel.sequence_parallel=true",
                                       "train.micro_batch_size=1",
                                       f"train.global_batch_size={m}"]),
               tuple(tt + ["--parallelism.data_parallel_shard_degree", "1",
                           "--parallelism.tensor_parallel_degree", "2",
                           "--training.local_batch_size", "1",
                           "--training.global_batch_size", str(m)]),
               f"TP 2 with SP, {m} accumulated microbatches, 2 processes"),
        Config("pp2", 2, tuple(base + ["parallel.dp_shard=1", "parallel.pp=2",
                                       "parallel.schedule=1F1B",
                                       "train.micro_batch_size=1",
                                       f"train.global_batch_size={m}"]),
               tuple(tt + ["--parallelism.data_parallel_shard_degree", "1",
                           "--parallelism.pipeline_parallel_degree", "2",
                           "--parallelism.pipeline_parallel_schedule", "1F1B",
                           "--parallelism.pipeline_parallel_microbatch_size", "1",
                           "--training.local_batch_size", str(m),
                           "--training.global_batch_size", str(m)]),
               f"PP 2, 1F1B, {m} microbatches, 2 processes"),
    ]


# ---- workers (run in their own processes) --------------------------------------------
def microbench_worker(out: str, quick: bool) -> None:
    import torch.distributed as dist
    dist.init_process_group("gloo")
    fit_collectives(out, 21 if quick else 23, 5 if quick else 10)


def measure_worker(out: str, name: str, quick: bool, repeats: int) -> None:
    import primus_ext
    from primus_ext.frameworks.torchtitan.measure import TitanMeasureOptions, \
        run_measurement
    c = next(c for c in configs(quick) if c.name == name)
    spec = primus_ext.compose(list(c.overrides))
    opts = TitanMeasureOptions(warmup=2, repeats=repeats, num_microbatches=4)
    prof = run_measurement(spec, REGISTRY + list(c.flags), opts)
    if int(os.environ.get("RANK", "0")) == 0:  # every rank returns the same Profile
        prof.save(out)


def measure_procs(c: Config) -> int:
    """Processes of the measurement: the target's TP group on the local ranks, one
    process otherwise (as scripts/cpu_proof.py). Over DTensor every TP collective is a
    functional collective that the next op waits for, and each costs DTensor's Python
    dispatch and redistribution around it: measured on the TP ranks, the blocks carry
    that dispatch and each collective its in-situ blocked time, which from_profile costs
    the modelled TP collectives at; one process runs the per-rank shapes without DTensor
    (tp2 came out 45-62% low that way, docs/cpu-proof-torchtitan.md)."""
    f = list(c.flags)
    flag = "--parallelism.tensor_parallel_degree"
    return int(f[f.index(flag) + 1]) if flag in f else 1


# ---- the driver ----------------------------------------------------------------------
def real_run(c: Config, quick: bool, iters: int, tmp: Path) -> dict:
    out = tmp / f"timings_{c.name}.json"
    cmd = _torchrun(c.nproc) + ["-m", "primus_ext.frameworks.torchtitan.train", *REGISTRY,
                                *c.flags, "--model-dims", json.dumps(_dims(quick)),
                                "--assets", str(tmp / "assets"), "--training.steps",
                                str(iters), "--metrics.log_freq", str(10 ** 6),
                                "--dump_folder", str(tmp / "dump"), "--timings-out",
                                str(out), "activation-checkpoint:none"]
    _run(cmd, timeout=1800)
    steps = json.loads(out.read_text())["steps_s"]
    return {"steps": steps, "median_step_s": _med(steady_steps(steps, WARMUP_STEPS))}


def project(c: Config, profile_path: str, fits: list[dict]):
    import primus_ext
    from primus_ext.project.from_profile import project_from_profile
    return project_from_profile(with_fits(profile_path, fits),
                                primus_ext.compose(list(c.overrides)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--write", action="store_true",
                    help="write docs/cpu-proof-torchtitan.{json,md}")
    ap.add_argument("--quick", action="store_true", help="small scale (the slow test)")
    ap.add_argument("--configs", default=None, help="comma-separated subset")
    ap.add_argument("--iters", type=int, default=None, help="real-run steps")
    ap.add_argument("--repeats", type=int, default=None, help="measured steps")
    ap.add_argument("--rounds", type=int, default=None, help="default 3; --quick 1")
    ap.add_argument("--json", default=None, help="write the results as JSON")
    ap.add_argument("--keep", default=None, help="keep profiles and fits in this folder")
    ap.add_argument("--render", action="store_true",
                    help="only rewrite the page from docs/cpu-proof-torchtitan.json")
    ap.add_argument("--_microbench", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--_measure", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--_name", default="", help=argparse.SUPPRESS)
    a = ap.parse_args()
    repeats = a.repeats or (3 if a.quick else 8)
    if a._microbench:
        microbench_worker(a._microbench, a.quick)
        return 0
    if a._measure:
        measure_worker(a._measure, a._name, a.quick, repeats)
        return 0
    if a.render:
        _write_doc(json.loads(RESULTS.read_text()))
        return 0
    all_cfgs = configs(a.quick)
    names = a.configs.split(",") if a.configs else [c.name for c in all_cfgs]
    unknown = sorted(set(names) - {c.name for c in all_cfgs})
    if unknown:
        raise SystemExit(f"--configs: unknown {unknown}; known: "
                         f"{[c.name for c in all_cfgs]}")
    cfgs = [c for c in all_cfgs if c.name in names]
    iters = a.iters or (6 if a.quick else 20)
    rounds = a.rounds or (1 if a.quick else 3)
    quick = ["--quick"] if a.quick else []
    t0 = time.time()
    per_cfg: dict[str, list[dict]] = {c.name: [] for c in cfgs}
    loads: list[tuple[str, float]] = []
    with tempfile.TemporaryDirectory() as tmpd:
        tmp = Path(a.keep or tmpd)
        tmp.mkdir(parents=True, exist_ok=True)
        for rnd in range(rounds):
            for c in cfgs:
                tag = f"round {rnd + 1}/{rounds}"
                procs = measure_procs(c)
                print(f"{tag}: measurement for {c.name}, {procs} process(es) ...",
                      flush=True)
                loads.append((f"round {rnd + 1} measurement {c.name}", _load()))
                prof_path = str(tmp / f"profile_{c.name}.json")
                launcher = _torchrun(procs) if procs > 1 else [sys.executable]
                _run(launcher + [__file__, "--_measure", prof_path, "--_name", c.name,
                                 "--repeats", str(repeats)] + quick, 1800)
                fits: list[dict] = []
                if c.nproc > 1:
                    print(f"{tag}: collective microbenchmarks, 2 processes ...", flush=True)
                    fits_path = tmp / f"fits_{c.name}.json"
                    _run(_torchrun(2) + [__file__, "--_microbench", str(fits_path)] + quick,
                         900)
                    fits = json.loads(fits_path.read_text())
                est = project(c, prof_path, fits)
                print(f"{tag}: real torchtitan run {c.name} ({c.nproc} processes, "
                      f"{iters} steps) ...", flush=True)
                loads.append((f"round {rnd + 1} real {c.name}", _load()))
                real = real_run(c, a.quick, iters, tmp)
                prof = json.loads(Path(prof_path).read_text())
                per_cfg[c.name].append({
                    "projected": est.step_time_s, "measured": real["median_step_s"],
                    "breakdown": est.breakdown, "notes": list(est.notes), "fits": fits,
                    "profile": {k: {"fwd_ms": v["fwd_s"] * 1e3, "bwd_ms": v["bwd_s"] * 1e3}
                                for k, v in prof["layers"].items()},
                    "steps": real["steps"]})
    rows = []
    for c in cfgs:
        rs = per_cfg[c.name]
        proj, meas = _med([r["projected"] for r in rs]), _med([r["measured"] for r in rs])
        rows.append({"config": c.name, "what": c.what, "nproc": c.nproc,
                     "overrides": list(c.overrides), "flags": list(c.flags),
                     "projected_step_s": proj, "measured_step_s": meas,
                     "error": paired_error(rs), "breakdown": rs[0]["breakdown"],
                     "rounds": rs})
    print(f"{'config':<8} {'projected step s':>17} {'measured step s':>16} {'error':>8}")
    for r in rows:
        print(f"{r['config']:<8} {r['projected_step_s']:>17.4f} "
              f"{r['measured_step_s']:>16.4f} {r['error']:>+8.1%}")
    print(f"(wall {time.time() - t0:.0f} s)")
    results = {"meta": _meta(a.quick, iters, repeats, rounds), "rows": rows, "loads": loads}
    text = json.dumps(results, indent=1) + "\n"
    if a.json:
        Path(a.json).write_text(text)
    if a.write:
        from primus_ext.util.files import atomic_write_text
        atomic_write_text(RESULTS, text)
        _write_doc(results)
    return 0


def _meta(quick: bool, iters: int, repeats: int, rounds: int) -> dict:
    from importlib.metadata import version
    return _proof_meta(quick, iters, repeats, rounds, torchtitan=version("torchtitan"),
                       warmup_steps=WARMUP_STEPS)


def _write_doc(results: dict) -> None:
    meta, rows, loads = (results[k] for k in ("meta", "rows", "loads"))
    lines = [
        "# CPU proof of the hybrid projection: torchtitan", "",
        "Generated by `scripts/cpu_proof_torchtitan.py --write"
        + (" --quick" if meta["quick"] else "") + f"` on {meta['date']} "
        f"({meta['machine']}, {meta['cores']} cores, torch {meta['torch']}, torchtitan "
        f"{meta['torchtitan']}); raw results in `docs/cpu-proof-torchtitan.json` "
        "(`--render` rewrites this page from them).", "",
        "This machine is the cluster (preset `cpu`, one node, one rank per core, gloo, one "
        "thread per process). For each target, one process (for a TP target, its TP "
        "ranks) measured its downscaled torchtitan run (torchtitan's own Trainer with the CPU patches of `patches/`, "
        f"{meta['repeats']} timed steps of per-block forward/backward times by hooks); for "
        "a multi-process target two processes then benchmarked the collectives "
        "(alpha-beta fits); the target was projected from that profile and then trained "
        "for real by torchtitan's Trainer under torchrun "
        f"(`python -m primus_ext.frameworks.torchtitan.train`, {meta['iters']} steps, the "
        f"median of the steps after the first {meta.get('warmup_steps', 2)}). All of it "
        f"{meta['rounds']} time(s); the table holds the medians over rounds of the projected and the measured "
        "step, and the median of the rounds' errors (a round's measurement and real run "
        "see one state of the machine, whose speed drifts over minutes).", "",
        *result_table(rows)]
    lines += ["", "Targets (primus-ext overrides; the same layout as torchtitan flags):", ""]
    for r in rows:
        lines.append(f"- {r['config']}: `{' '.join(r['overrides'])}`; "
                     f"`{' '.join(r['flags'])}`")
    lines += ["", "Projected breakdown (s), first round:", ""]
    lines += breakdown_table(rows)
    lines += ["", "Per round: projected / measured step (s):", ""]
    for r in rows:
        lines.append(f"- {r['config']}: " + "; ".join(
            f"{x['projected']:.4f} / {x['measured']:.4f} "
            f"({x['projected'] / x['measured'] - 1:+.0%})" for x in r["rounds"]))
    lines += ["", "Measured one-process profile (ms per block and microbatch, last round):",
              ""]
    for r in rows:
        prof = r["rounds"][-1]["profile"]
        lines.append(f"- {r['config']}: " + "; ".join(
            f"{k} {v['fwd_ms']:.2f} fwd / {v['bwd_ms']:.2f} bwd" for k, v in prof.items()))
    lines += ["", "Real-run step times (s), last round:", ""]
    for r in rows:
        lines.append(f"- {r['config']}: " + ", ".join(f"{x:.3f}"
                                                      for x in r["rounds"][-1]["steps"]))
    lines += ["", "1-minute load average when each phase started (2 cores, shared):", "",
              ", ".join(f"{n} {v:.2f}" for n, v in loads), "", NOTES]
    from primus_ext.util.files import atomic_write_text
    out = ROOT / "docs" / "cpu-proof-torchtitan.md"
    atomic_write_text(out, "\n".join(lines))
    print(f"wrote {out}")


if __name__ == "__main__":
    sys.exit(main())
