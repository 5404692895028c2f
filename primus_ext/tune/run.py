"""``tune(spec_or_overrides, settings) -> TuneResult``: the tuner end to end.

space (size reported) -> journal (resume) -> baseline and planner seeds -> reference
layout -> exhaustive or guided search under the budget -> optional LLM rounds ->
optional hybrid re-ranking -> the recipe directory (when ``out_dir`` is set).

Ctrl-C stops the search where it is: the journal is complete up to the last finished
trial, the recipe of the best layout so far is written, and ``tune.resume=true`` (with
the same ``tune.out_dir``) continues from the journal.
"""
from __future__ import annotations

import logging
import os
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from primus_ext.spec import RunSpec
from primus_ext.tune.evaluate import BudgetExhausted, Evaluator, Trial
from primus_ext.tune.journal import Journal, job_key
from primus_ext.tune.planner import plan
from primus_ext.tune.reference import Reference, find_reference
from primus_ext.tune.search import exhaustive, guided
from primus_ext.tune.settings import TuneSettings
from primus_ext.tune.space import SearchSpace, describe, point_of, space_of
from primus_ext.util.files import lock_dir

log = logging.getLogger("primus_ext.tune")


@dataclass
class TuneResult:
    best: Trial | None
    best_spec: RunSpec | None
    baseline: Trial  # the user's layout as given
    start: Trial  # the legal, fitting baseline the planner swept around
    base_spec: RunSpec
    settings: TuneSettings
    strategy: str
    space: dict
    stats: dict
    trials: list[Trial]
    reference: dict | None = None
    pareto: list[Trial] = field(default_factory=list)
    llm_rounds: list = field(default_factory=list)
    llm_note: str | None = None
    hybrid: list[Trial] | None = None
    interrupted: bool = False
    out_dir: Path | None = None
    files: dict = field(default_factory=dict)
    spec_of: Callable[[tuple], RunSpec | None] | None = None

    def top(self, k: int) -> list[Trial]:
        return sorted((t for t in self.trials if t.verdict == "ok"),
                      key=lambda t: (-t.score, t.index))[:k]

    def to_dict(self) -> dict:
        def trial(t: Trial | None):
            if t is None:
                return None
            return {**t.to_record(), "layout": describe(t.point)}
        return {"best": trial(self.best), "baseline": trial(self.baseline),
                "start": trial(self.start), "strategy": self.strategy,
                "objective": self.settings.objective,
                "space": {k: v for k, v in self.space.items()},
                "stats": self.stats, "reference": self.reference,
                "pareto": [trial(t) for t in self.pareto],
                "top": [trial(t) for t in self.top(self.settings.top_k)],
                "llm_rounds": [r.to_record() for r in self.llm_rounds],
                "llm_note": self.llm_note,
                "hybrid": [trial(t) for t in self.hybrid] if self.hybrid else None,
                "interrupted": self.interrupted,
                "out_dir": str(self.out_dir) if self.out_dir else None,
                "files": {k: str(v) for k, v in self.files.items()}}


def default_out_dir() -> Path:
    """Where a Python-API run writes when the config's out_dir needs a Hydra run."""
    home = os.environ.get("PRIMUS_EXT_HOME") or os.path.join(
        os.environ.get("HOME", "/tmp"), ".cache", "primus-ext")
    return Path(home) / "runs" / time.strftime("%Y-%m-%d_%H-%M-%S") / "recipe"


def _from_overrides(overrides: Sequence[str]) -> tuple[RunSpec, dict, dict]:
    """Override strings composed by the Hydra edge (``config.tune_inputs``); the tuner
    itself never imports Hydra."""
    from primus_ext.config import tune_inputs
    base, data, extra = tune_inputs(list(overrides))
    out = data.get("out_dir")
    if isinstance(out, str) and "${" in out:  # ${hydra:...} needs a Hydra run
        data["out_dir"] = str(default_out_dir())
    return base, data, extra


def _merge(base: dict, top: dict) -> dict:
    out = dict(base)
    for k, v in top.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) \
            else v
    return out


def _job(spec: RunSpec) -> dict:
    t, c = spec.train, spec.cluster
    return {"model": spec.model.name, "num_layers": spec.model.num_layers,
            "hidden_size": spec.model.hidden_size,
            "num_moe_experts": spec.model.num_moe_experts,
            "hardware": c.hardware.name, "num_nodes": c.num_nodes,
            "gpus_per_node": c.node_size, "world_size": spec.world_size,
            "global_batch_size": t.global_batch_size, "seq_length": t.seq_length,
            "precision": t.precision, "hbm_gib": round(c.hardware.hbm_bytes / 2**30, 1)}


def tune(spec_or_overrides: RunSpec | Sequence[str], settings: TuneSettings | dict | None = None,
         *, overrides: Sequence[str] | None = None, memory_fn: Callable | None = None,
         project_fn: Callable | None = None, llm_client: Any = None,
         write: bool = True, prefetched: dict | None = None) -> TuneResult:
    """Tune the layout of a job.

    ``spec_or_overrides``: a RunSpec, or Hydra override strings as for the CLI (then
    ``settings`` defaults to the composed ``tune`` group). ``settings``: TuneSettings, a
    dict in the shape of the ``tune`` group, or None for the defaults. ``overrides``:
    the user's overrides behind a RunSpec, so overrides.txt repeats them.
    ``memory_fn`` / ``project_fn`` replace the memory model and projector (tests).
    ``prefetched``: scores computed by shard workers, by point (``tune.shard``).

    ``tune.out_dir`` is locked for the whole run (util/files.py: a second tuner on the
    same directory fails at once) and released when this returns or raises.
    """
    with ExitStack() as held:
        return _tune(spec_or_overrides, settings, held, overrides, memory_fn, project_fn,
                     llm_client, write, prefetched)


def _tune(spec_or_overrides, settings, held: ExitStack, overrides, memory_fn, project_fn,
          llm_client, write, prefetched=None) -> TuneResult:
    if isinstance(spec_or_overrides, RunSpec):
        base = spec_or_overrides
        user_overrides = list(overrides) if overrides is not None else None
        if isinstance(settings, dict):
            settings = TuneSettings.from_dict(settings)
    else:
        user_overrides = list(spec_or_overrides)
        base, composed, extra = _from_overrides(user_overrides)
        if not isinstance(settings, TuneSettings):  # a dict refines the composed group
            settings = TuneSettings.from_dict(_merge(composed, settings or {}), **extra)
    settings = settings or TuneSettings()
    from primus_ext.tune.hybrid import check_available
    check_available(settings)
    if write and base.framework == "torchtitan":  # its recipe needs a config function
        from primus_ext.frameworks.torchtitan.registry import registry_for
        registry_for(base.model)

    space = space_of(base, settings)
    t0 = time.monotonic()
    num_legal = space.num_legal
    log.info("search space: %d raw points, %d distinct, %d legal (%.2f s)", space.num_raw,
             space.num_distinct, num_legal, time.monotonic() - t0)
    strategy = settings.strategy
    clusters = [(n, h) for n in space.axes["num_nodes"] for h in space.axes["hardware"]]
    if strategy == "auto":  # the candidate budget is per cluster
        budget = settings.max_candidates * len(clusters)
        strategy = "exhaustive" if num_legal <= budget else "guided"

    out_dir = Path(settings.out_dir) if (settings.out_dir and write) else None
    journal = None
    if out_dir is not None:
        held.enter_context(lock_dir(out_dir, "tune.out_dir"))
        journal = Journal(out_dir / "trials.jsonl",
                          {"job": _job(base), "job_key": job_key(base, settings.calibration),
                           "objective": settings.objective},
                          resume=settings.resume, overwrite=settings.overwrite)
    from primus_ext.emit.progress import TuneProgress
    progress = TuneProgress(settings, num_legal if strategy == "exhaustive"
                            else settings.max_candidates * len(clusters)) \
        if settings.progress else None
    ev = Evaluator(space, settings, memory_fn=memory_fn, project_fn=project_fn,
                   journal=journal, on_trial=progress.update if progress else None,
                   prefetched=prefetched, started=t0)
    if journal is not None:
        for rec in journal.resumed:
            ev.preload(Trial.from_record(rec))
        if journal.resumed:
            log.info("resumed %d trials from %s", len(journal.resumed), journal.path)
    if strategy == "exhaustive":  # every legal point, whatever the candidate budget
        # tune.strategy=exhaustive: whatever the time budget too; chosen by auto (the
        # legal space fits the candidate budget), tune.budget.seconds still holds.
        settings_run = settings.replace(
            max_candidates=10**12,
            max_seconds=settings.max_seconds if settings.strategy == "auto" else None)
        ev.settings = settings_run

    interrupted = False
    user = start = None
    reference, ref_trial, llm_rounds, llm_note, hybrid = None, None, [], None, None
    try:
        if progress:
            progress.start(f"search space: {space.num_raw:,} points, {space.num_distinct:,} "
                           f"distinct, {num_legal:,} legal; strategy {strategy}")
        fixed = CLUSTER_AXES if len(clusters) > 1 and strategy == "guided" else ()
        user, start, seeds = plan(ev, point_of(base), fixed=fixed)
        reference, ref_trial = score_references(ev, base)
        try:
            if strategy == "exhaustive":
                exhaustive(ev)
            elif not fixed:
                guided(ev, seeds + ([ref_trial] if ref_trial else []), settings.restarts)
            else:
                _plan_clusters(ev, clusters, point_of(base), seeds, settings.restarts)
        except BudgetExhausted:
            pass
        if settings.llm.enabled:
            llm_rounds, llm_note = _run_llm(ev, settings, base, start, journal, llm_client)
    except KeyboardInterrupt:
        interrupted = True
        log.warning("interrupted: the journal holds every finished trial; rerun with "
                    "tune.resume=true tune.out_dir=%s", out_dir)
        if user is None:
            user = ev.cache.get(space.normalize(point_of(base)))
        if user is None:
            raise
        start = start or user
    finally:
        if progress:
            progress.stop()
        if journal is not None:
            journal.close()
    scorer = None
    if settings.backend == "hybrid" and not interrupted and ev.best is not None:
        from primus_ext.tune.hybrid import ProfileScorer, rerank
        scorer = ProfileScorer(settings)
        hybrid = rerank(ev, settings, scorer)
        # The comparisons in the report use the same (measured-profile) figures.
        user = scorer.rescore(user, space.spec(user.point)) if user.verdict == "ok" else user
        start = scorer.rescore(start, space.spec(start.point)) \
            if start.verdict == "ok" else start

    best = hybrid[0] if hybrid else ev.best
    stats = {**ev.stats(), "strategy": strategy,
             "budget": {"candidates": settings.max_candidates,
                        "seconds": settings.max_seconds,
                        "num_clusters": len(clusters)}}
    result = TuneResult(best=best, best_spec=space.spec(best.point) if best else None,
                        baseline=user, start=start, base_spec=base, settings=settings,
                        strategy=strategy, space=space.summary(), stats=stats,
                        trials=list(ev.trials), llm_rounds=llm_rounds, llm_note=llm_note,
                        hybrid=hybrid, interrupted=interrupted, out_dir=out_dir,
                        spec_of=space.spec)
    result.reference = _reference_entry(reference, ref_trial, ev, result, scorer)
    from primus_ext.tune.pareto import pareto_front
    result.pareto = pareto_front(ev.ok_trials(), space)
    if out_dir is not None and best is not None:
        from primus_ext.emit.recipe import write_recipe
        result.files = write_recipe(result, out_dir, user_overrides,
                                    project_fn=project_fn)
    return result


CLUSTER_AXES = ("num_nodes", "hardware")


def score_references(ev: Evaluator, base: RunSpec) -> tuple[Reference | None, Trial | None]:
    """The reference run (tune.reference) and its layout's trial; with
    ``tune.reference=auto`` every published layout of the job is scored too (each is a
    candidate, whatever the budget)."""
    which = ev.settings.reference
    if which is None or str(which).lower() in ("none", "null", "false", ""):
        return None, None
    from primus_ext.tune.reference import published_runs, same_job_layouts
    runs = published_runs(base, None if str(which).lower() == "auto" else str(which))
    reference = find_reference(base, which, runs)
    trial = None
    if reference is not None and reference.same_job:
        trial = ev.evaluate(point_of(reference.spec), "reference", enforce_budget=False)
    if reference is not None and str(which).lower() == "auto":
        for other in same_job_layouts(base, runs):
            ev.evaluate(point_of(other), "published", enforce_budget=False)
    return reference, trial



def _plan_clusters(ev: Evaluator, clusters: list, base_point, base_seeds: list[Trial],
                   restarts: int, only: list | None = None) -> None:
    """Cluster planning: each (num_nodes, hardware) gets its own planner seeds and
    guided search; the candidate budget applies to each cluster, the time budget is
    shared evenly by what is left of it. ``only``: search these clusters, skip the
    others (a shard of the search, tune/shard.py)."""
    space = ev.space
    ev.settings = ev.settings.replace(
        max_candidates=ev.settings.max_candidates * len(clusters))
    per_cluster = ev.settings.max_candidates // len(clusters)
    for i, (n, h) in enumerate(clusters):
        if only is not None and (n, h) not in only:
            continue
        _, secs = ev.remaining()
        left = len(clusters) - i
        with ev.limit(per_cluster, None if secs is None else secs / left):
            try:
                start = space.vary(base_point, num_nodes=n, hardware=h)
                if start == space.vary(base_point):
                    seeds = base_seeds
                else:
                    _, _, seeds = plan(ev, start, source="planner", fixed=CLUSTER_AXES)
                if seeds:
                    guided(ev, seeds, restarts, fixed=CLUSTER_AXES)
            except BudgetExhausted:
                continue


def _run_llm(ev, settings, base, start, journal, client):
    from primus_ext.tune.llm import LLMLoop

    loop = LLMLoop(ev, settings.llm, _job(base), start.point, journal=journal,
                   client=client)
    try:
        rounds = loop.run()
    except RuntimeError as exc:  # no endpoint configured
        log.warning("LLM loop skipped: %s", exc)
        return [], f"skipped: {exc}"
    return rounds, None


def _reference_entry(ref: Reference | None, trial: Trial | None, ev: Evaluator,
                     result: TuneResult, scorer=None) -> dict | None:
    if ref is None:
        return None
    entry = {"run_id": ref.run_id, "source": ref.source, "same_job": ref.same_job,
             "measured_tokens_per_s_per_gpu": ref.measured_tokens_per_s_per_gpu,
             "layout": describe(point_of(ref.spec)), "verdict": None, "reason": None,
             "projected": None, "gain": None, "recompute_inferred": ref.recompute_inferred,
             "point": list(trial.point) if trial is not None else None}
    metrics = trial.metrics if trial is not None and trial.verdict == "ok" else None
    if trial is not None:
        entry["verdict"], entry["reason"] = trial.verdict, trial.reason
    try:
        if scorer is not None:
            metrics = scorer.metrics(ref.spec)
        elif metrics is None:
            # Projected anyway (the memory model may reject it): the report shows it.
            from primus_ext.tune.evaluate import compact_estimate
            est = ev.project_fn(ref.spec)
            mem = est.memory
            device = getattr(mem, "device_bytes", None) or ref.spec.cluster.hardware.hbm_bytes
            metrics = compact_estimate(est, ref.spec, mem.peak_bytes, device)
    except Exception as exc:  # noqa: BLE001 - the report says why, the tune goes on
        entry["reason"] = f"projection failed: {type(exc).__name__}: {exc}"
    entry["projected"] = metrics
    if metrics and result.best is not None and result.best.metrics:
        entry["gain"] = (result.best.metrics["tokens_per_s_per_gpu"]
                         / metrics["tokens_per_s_per_gpu"] - 1.0)
    return entry
