"""What the primus_tuner sweeper leaves in the sweep directory and on the terminal.

- ``optimization_results.yaml``: Hydra's sweeper convention (``best_evaluated_params``,
  ``best_evaluated_result``), plus the top candidates with their projections and, when
  validated, their jobs' returns.
- ``summary.csv``: one row per validation job (``primus_ext.emit.sweep_summary``), with
  the projection beside it.
- a table: the top candidates, projected against launched.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from omegaconf import OmegaConf

from primus_ext.util.values import json_safe

GIB = 2**30


def _value(job_return) -> Any:
    from primus_ext.emit.sweep_callback import job_value
    return job_value(job_return)


def _scalar(text: str):
    """An override's value as YAML reads it ('8' -> 8, 'null' -> None)."""
    import yaml
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    return value if value is None or isinstance(value, (bool, int, float, str)) else text


def _figures(d: dict | None) -> dict:
    d = d or {}
    peak = d.get("peak_memory_bytes")
    return {"tokens_per_s_per_gpu": d.get("tokens_per_s_per_gpu"),
            "step_time_s": d.get("step_time_s"), "mfu": d.get("mfu"),
            "peak_memory_gib": peak / GIB if isinstance(peak, (int, float)) else None}


def _layout(trial) -> str:
    from primus_ext.tune.space import describe
    return describe(trial.point)


def write_results(path: Path, result, candidates, returns) -> None:
    best, (_, best_overrides) = result.best, candidates[0]
    top = []
    for i, (trial, overrides) in enumerate(candidates):
        entry = {"rank": i + 1, "layout": _layout(trial),
                 "hardware": trial.candidate["hardware"],
                 "num_nodes": trial.candidate["num_nodes"], "overrides": list(overrides),
                 "score": trial.score, "projected": _figures(trial.metrics)}
        if i < len(returns):
            value = _value(returns[i])
            entry["job"] = {"overrides": list(returns[i].overrides or ()),
                            "verdict": _verdict(value),
                            **_figures(value if isinstance(value, dict) else None)}
        top.append(entry)
    doc = {"name": "primus_tuner",
           "objective": result.settings.objective,
           "best_evaluated_params": {o.split("=", 1)[0]: _scalar(o.split("=", 1)[1])
                                     for o in best_overrides if "=" in o},
           "best_evaluated_result": best.score,
           "best_layout": _layout(best),
           "baseline": {"layout": _layout(result.baseline),
                        "verdict": result.baseline.verdict,
                        "projected": _figures(result.baseline.metrics)},
           "strategy": result.strategy, "stats": result.stats,
           "recipe_files": {k: str(v) for k, v in (result.files or {}).items()},
           "top": top}
    OmegaConf.save(OmegaConf.create(json_safe(doc, default=str)), path)


def write_summary(path: Path, candidates, returns) -> None:
    from primus_ext.emit.sweep_summary import JobResult, write_summary_csv

    jobs = []
    for i, (ret, (trial, _)) in enumerate(zip(returns, candidates)):
        proj = _figures(trial.metrics)
        jobs.append(JobResult(
            num=i, overrides=tuple(ret.overrides or ()), result=_value(ret),
            extra={"tuner_rank": i + 1, "layout": _layout(trial),
                   "projected_tokens_per_s_per_gpu": proj["tokens_per_s_per_gpu"],
                   "projected_step_time_s": proj["step_time_s"],
                   "projected_peak_memory_gib": proj["peak_memory_gib"]}))
    write_summary_csv(jobs, path)


def print_report(result, candidates: Sequence, returns: Sequence, sweep_dir: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    from primus_ext.emit.console import fmt

    n = len(result.trials)
    title = (f"primus_tuner: the {len(candidates)} best of {n} candidates "
             f"({result.strategy} search)" + (", launched as jobs" if returns else ""))
    table = Table(title=title, caption=f"objective {result.settings.objective}; results "
                                       f"and recipe in {sweep_dir.resolve()}")
    table.add_column("#", justify="right")
    table.add_column("layout", no_wrap=True)
    # Several GPU kinds (cluster.hardware=a,b): which GPU each row is for, its capacity.
    kinds = len({t.candidate["hardware"] for t in result.trials}) > 1
    if kinds:
        table.add_column("GPU (capacity GiB)", no_wrap=True)
    head = ["proj. tok/s/GPU", "proj. step s", "proj. MFU", "proj. GiB"]
    if returns:
        head += ["job tok/s/GPU", "job step s", "job/proj.", "job GiB", "job verdict"]
    for name in head:
        table.add_column(name, justify="right")
    for i, (trial, _) in enumerate(candidates):
        proj = _figures(trial.metrics)
        gpu = [_gpu(trial)] if kinds else []
        row = [i + 1, _layout(trial), *gpu, proj["tokens_per_s_per_gpu"],
               proj["step_time_s"],
               None if proj["mfu"] is None else f"{proj['mfu']:.1%}",
               None if proj["peak_memory_gib"] is None else f"{proj['peak_memory_gib']:.1f}"]
        if returns and i >= len(returns):
            row += [None, None, None, None, "not launched"]
        elif returns:
            value = _value(returns[i])
            job = _figures(value if isinstance(value, dict) else None)
            tps = job["tokens_per_s_per_gpu"]
            delta = (tps / proj["tokens_per_s_per_gpu"] - 1.0
                     if tps and proj["tokens_per_s_per_gpu"] else None)
            row += [tps, job["step_time_s"],
                    None if delta is None else f"{delta:+.1%}",
                    None if job["peak_memory_gib"] is None
                    else f"{job['peak_memory_gib']:.1f}", _verdict(value)]
        table.add_row(*["-" if c is None else fmt(c) for c in row])
    Console(width=170).print(table)


def _gpu(trial) -> str:
    c, m = trial.candidate, trial.metrics or {}
    cap = m.get("device_bytes")
    return (f"{c['hardware']} x {c['num_nodes']}"
            + ("" if cap is None else f" ({cap / GIB:.0f})"))


def _verdict(value) -> str:
    if not isinstance(value, dict):
        return "failed"
    if value.get("verdict"):
        return str(value["verdict"])
    return "fits" if value.get("fits", True) else "oom"
