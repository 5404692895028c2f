"""docs/tuning.md: the tuner against every published layout of the public validation set.

For each published run with a usable layout (primus_ext/data/validation/published_runs.csv),
the job a tuner would face is that run's: the same model, GPUs, global batch, sequence,
precision and the run's own non-layout settings (as the published-run reader states or
fills them). The tuner searches the layout with ``tune.reference=<run_id>`` (the
published layout is always one of its candidates), and both layouts are projected by the
same projector (the published one exactly as ``mode=project`` projects the reader's
spec). Beside each figure: its 80% error band (project/bands.py) and whether the gain is
resolvable or a tie (tune/ties.py); where the tuner claims a resolvable gain, the
step-time component that saves most names the mechanism (fewer bubbles, less exposed
communication, less recompute, a better batch split).

Usage: python scripts/tuning_report.py [--write] [--seconds S] [--only P012,P031]
Prints one line per run (tune seconds included); --write writes docs/tuning.md.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from primus_ext.emit.tune_ties import band_cell  # noqa: E402
from primus_ext.project.estimate import project  # noqa: E402
from primus_ext.project.validate import recompute_inferred  # noqa: E402
from primus_ext.published import read_runs  # noqa: E402
from primus_ext.tune.evaluate import compact_estimate  # noqa: E402
from primus_ext.tune.run import tune  # noqa: E402
from primus_ext.tune.space import describe, point_of  # noqa: E402
from primus_ext.tune.splits import split_label  # noqa: E402
from primus_ext.tune.ties import versus  # noqa: E402
from primus_ext.util.files import atomic_write_text  # noqa: E402

OUT = ROOT / "docs" / "tuning.md"
# The projected gain under which the tuner counts as losing to a published layout.
TOLERANCE = 0.005
MECHANISMS = {"pp_bubble_s": "fewer bubbles", "tp_comm_s": "less exposed communication",
              "cp_comm_s": "less exposed communication",
              "ep_comm_s": "less exposed communication",
              "dp_comm_s": "less exposed communication", "recompute_s": "less recompute",
              "compute_s": "a better batch split", "optimizer_s": "a better batch split",
              "host_pause_s": "a smaller FSDP group (fewer ranks' host pauses)"}


def _projected(spec) -> dict:
    """The published layout as mode=project projects it, in the tuner's compact form."""
    est = project(spec)
    device = getattr(est.memory, "device_bytes", None) or spec.cluster.hardware.hbm_bytes
    out = compact_estimate(est, spec, est.memory.peak_bytes, device)
    out["memory_over_device"] = not est.fits
    return out


def mechanism(ref: dict, win: dict) -> str:
    """The step-time components the winner saves most on, as mechanisms."""
    saved: dict[str, float] = {}
    for k, name in MECHANISMS.items():
        d = ref["breakdown"].get(k, 0.0) - win["breakdown"].get(k, 0.0)
        saved[name] = saved.get(name, 0.0) + d
    if ref["num_microbatches"] == win["num_microbatches"]:
        # Same batch split: a compute saving is the kernels' shapes (TP, micro batch).
        saved["faster kernels at the new shapes"] = saved.pop("a better batch split")
    top = sorted(((v, k) for k, v in saved.items() if v > 0), reverse=True)
    total = sum(v for v, _ in top) or 1.0
    return ", ".join(f"{k} ({v / total:.0%})" for v, k in top[:2] if v / total >= 0.2) or "-"


def _layout(spec, point) -> str:
    split = split_label(spec.parallel) if spec is not None else ""
    return describe(point) + (f", {split}" if split else "")


def tune_run(run, seconds: float) -> dict:
    t0 = time.perf_counter()
    r = tune(run.spec, {"progress": False, "reference": run.run_id, "out_dir": None,
                        "budget": {"seconds": seconds}}, write=False)
    wall = time.perf_counter() - t0
    pub = _projected(run.spec)
    best = r.best.metrics
    inferred = recompute_inferred(run)
    moe = run.spec.model.is_moe
    cmp = versus(best, pub, moe, inferred)
    gain = best["tokens_per_s_per_gpu"] / pub["tokens_per_s_per_gpu"] - 1
    ref_trial = (r.reference or {}).get("projected") or {}
    same = r.best_spec == run.spec
    return {"run": run, "seconds": wall, "evaluated": r.stats["evaluated"],
            "pub": pub, "best": best, "gain": gain, "same": same,
            "resolvable": cmp.resolvable and not same,
            "words": cmp.words(), "pub_band": band_cell(pub, moe, inferred),
            # the same layout has the same band (the published one's basis)
            "best_band": band_cell(best, moe, inferred and same), "inferred": inferred,
            "tuned_layout": _layout(r.best_spec, r.best.point),
            "pub_layout": _layout(run.spec, point_of(run.spec)),
            "tight": bool(best.get("memory_tight")),
            # the published layout as the tuner scored it (must equal mode=project's)
            "scored_as_project": ref_trial.get("tokens_per_s_per_gpu")
            == pub["tokens_per_s_per_gpu"],
            "mechanism": mechanism(pub, best) if cmp.resolvable and gain > 0 else ""}


def _job(spec) -> str:
    t = spec.train
    return (f"{spec.model.name} on {spec.world_size} x {spec.cluster.hardware.name}, "
            f"GBS {t.global_batch_size}, seq {t.seq_length}, {t.precision}"
            + (", torchtitan" if spec.framework == "torchtitan" else ""))


def _verdict(x: dict) -> str:
    if x["same"]:
        return "same layout"
    return "resolvable" if x["resolvable"] else "tie"


def render(rows: list[dict], failed: list[tuple], seconds: float) -> str:
    n = len(rows)
    losing = [x for x in rows if x["gain"] < -TOLERANCE]
    resolvable = [x for x in rows if x["resolvable"] and x["gain"] > 0]
    ties = [x for x in rows if not x["resolvable"] and not x["same"]]
    same = [x for x in rows if x["same"]]
    slow = max((x["seconds"] for x in rows), default=0.0)
    L = ["# The tuner against published layouts", "",
         "Generated by `scripts/tuning_report.py --write`; do not edit by hand.", "",
         "Each published run of the public validation set with a usable layout "
         "(primus_ext/data/validation/published_runs.csv) is a job a tuner would face: "
         "the same model, GPUs, global batch, sequence, precision and the run's own "
         "non-layout settings. The tuner searches the layout (default strategy, "
         f"`tune.budget.seconds={seconds:g}`, `tune.reference=<run_id>`: the published "
         "layout is always one of its candidates); the published layout is projected "
         "exactly as `mode=project` projects it. A published layout ran: where the "
         "memory model puts it over the device it stays a candidate, marked. Bands are the 80% error bands of "
         "tokens/s/GPU (project/bands.py); a gain inside the band of the difference is "
         "a tie (tune/ties.py). Where the gain is resolvable, the mechanism names the "
         "step-time components the tuned layout saves most on (share of the saving).", "",
         f"- runs: {n}; the tuned layout projects at least as fast as the published one "
         f"(within {TOLERANCE:.1%}) on {n - len(losing)} of {n}"
         + (f"; slower on {', '.join(x['run'].run_id for x in losing)}" if losing else ""),
         f"- the published layout is the tuner's best: {len(same)}; resolvable gains: "
         f"{len(resolvable)}; ties within the projector's error: {len(ties)}",
         f"- published layout scored by the tuner exactly as mode=project: "
         f"{sum(x['scored_as_project'] for x in rows)} of {n}",
         f"- tune time per run: median {sorted(x['seconds'] for x in rows)[n // 2]:.1f} s, "
         f"max {slow:.1f} s (this machine, one process)" if rows else "- no runs", ""]
    head = ["run", "job", "published layout", "tok/s/GPU (80% band)", "tuned layout",
            "tok/s/GPU (80% band)", "gain", "verdict", "mechanism"]
    L += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for x in rows:
        run, pub, best = x["run"], x["pub"], x["best"]
        L.append("| " + " | ".join([
            run.run_id, _job(run.spec),
            x["pub_layout"] + (" (recompute inferred)" if x["inferred"] else "")
            + (" (memory model: over the device)" if pub["memory_over_device"] else ""),
            f"{pub['tokens_per_s_per_gpu']:,.0f} ({x['pub_band']})",
            x["tuned_layout"] + (" (memory over the device: the published layout)"
                                 if best.get("memory_over_device") else
                                 " (memory tight)" if x["tight"] else ""),
            f"{best['tokens_per_s_per_gpu']:,.0f} ({x['best_band']})",
            f"{x['gain']:+.1%}", _verdict(x),
            x["mechanism"] or "-"]) + " |")
    if failed:
        L += ["", "Runs the tuner could not tune:", ""]
        L += [f"- {rid}: {why}" for rid, why in failed]
    return "\n".join(L) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="write docs/tuning.md")
    ap.add_argument("--seconds", type=float, default=20.0,
                    help="tune.budget.seconds per run (default 20)")
    ap.add_argument("--only", default="", help="comma-separated run_ids")
    args = ap.parse_args()
    only = {s.strip() for s in args.only.split(",") if s.strip()}
    rows, failed = [], []
    for run in read_runs():
        if run.spec is None or (only and run.run_id not in only):
            continue
        try:
            x = tune_run(run, args.seconds)
        except Exception as exc:  # noqa: BLE001 - the page says which run and why
            failed.append((run.run_id, f"{type(exc).__name__}: {exc}"))
            print(f"{run.run_id}: failed: {exc}", flush=True)
            continue
        rows.append(x)
        print(f"{run.run_id} {x['seconds']:5.1f} s {x['evaluated']:5d} cand | pub "
              f"{x['pub']['tokens_per_s_per_gpu']:8.1f} {x['pub_layout']} | tuned "
              f"{x['best']['tokens_per_s_per_gpu']:8.1f} {x['tuned_layout']} | "
              f"{x['gain']:+.1%} {_verdict(x)} "
              f"{x['mechanism']}", flush=True)
    text = render(rows, failed, args.seconds)
    if args.write:
        atomic_write_text(OUT, text, "docs/tuning.md")
        print(f"wrote {OUT}")
    losing = [x["run"].run_id for x in rows if x["gain"] < -TOLERANCE]
    print(f"{len(rows)} runs, {len(losing)} where the tuner loses: {losing}; max tune "
          f"{max((x['seconds'] for x in rows), default=0):.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
