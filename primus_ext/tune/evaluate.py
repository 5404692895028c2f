"""Scoring candidates: memory pre-filter, then the projector, cached by point, journaled.

A candidate first meets the memory model, with the options ``mode=project`` uses: a
peak over the device rejects it before any projection (milliseconds saved per
candidate, and a layout that does not fit is no answer whatever its speed). What fits is
projected exactly as ``mode=project`` projects it; the trial keeps a compact copy of the
Estimate (figures, breakdown, memory peak) for the journal, the search and the report.
``tune.memory_margin`` is a reported risk, not a filter: a fitting peak within that share
of the device is marked ``memory_tight`` (layouts that ran sit there: 167 GiB on B200).
A published layout of the job ran: the memory model does not reject it; a peak over the
device is marked ``memory_over_device`` (and tight) instead.
"""
from __future__ import annotations

import contextlib
import time
from collections import Counter
from dataclasses import dataclass
from typing import Callable

from primus_ext.spec import RunSpec
from primus_ext.tune.space import AXES, Point, SearchSpace, as_dict
from primus_ext.tune.settings import TuneSettings

# Trial sources of published layouts (tune.reference): layouts that ran.
PUBLISHED_SOURCES = ("reference", "published")
VERDICTS = ("ok", "oom", "illegal", "skipped", "out_of_space", "error")


class BudgetExhausted(Exception):
    """The candidate or time budget is spent; the search stops where it is."""


@dataclass(kw_only=True, slots=True)
class Trial:
    point: Point
    source: str  # baseline | planner | search | exhaustive | llm | reference
    verdict: str  # one of VERDICTS
    reason: str | None = None
    metrics: dict | None = None  # compact Estimate (see compact_estimate)
    score: float | None = None  # the objective, higher is better
    hypothesis: str | None = None  # LLM candidates: why it should be faster
    index: int = -1

    @property
    def candidate(self) -> dict:
        return as_dict(self.point)

    def to_record(self) -> dict:
        return {"kind": "trial", "index": self.index, "source": self.source,
                "candidate": self.candidate, "verdict": self.verdict,
                "reason": self.reason, "score": self.score,
                "hypothesis": self.hypothesis, "estimate": self.metrics}

    @classmethod
    def from_record(cls, rec: dict) -> "Trial":
        cand = rec["candidate"]
        return cls(point=tuple(cand.get(a) for a in AXES), source=rec["source"],
                   verdict=rec["verdict"], reason=rec.get("reason"),
                   metrics=rec.get("estimate"), score=rec.get("score"),
                   hypothesis=rec.get("hypothesis"), index=rec.get("index", -1))


def compact_estimate(est, spec: RunSpec, peak_bytes: int, device_bytes: int) -> dict:
    return {"step_time_s": est.step_time_s,
            "tokens_per_s_per_gpu": est.tokens_per_s_per_gpu,
            "tokens_per_s": est.tokens_per_s_per_gpu * spec.world_size,
            "tflops_per_gpu": est.tflops_per_gpu, "mfu": est.mfu,
            "peak_memory_bytes": peak_bytes, "device_bytes": device_bytes,
            # torch.cuda.max_memory_allocated of the worst stage (memory/report.py)
            "allocated_peak_bytes": max((s.allocated_peak_bytes
                                         for s in getattr(est.memory, "stages", ())),
                                        default=None),
            "breakdown": dict(est.breakdown), "num_microbatches": est.num_microbatches,
            "schedule": est.schedule, "critical_stage": est.critical_stage,
            "world_size": spec.world_size, "hardware": spec.cluster.hardware.name,
            "num_nodes": spec.cluster.num_nodes, "backend": est.backend,
            "band_features": dict(getattr(est, "band_features", None) or {})}


def gpu_hour_cost(spec: RunSpec, settings: TuneSettings) -> float | None:
    """Price of one GPU-hour of the spec's hardware: tune.gpu_hour_cost.<hw>, else the
    cluster's gpu_hour_cost."""
    hw = spec.cluster.hardware.name
    if hw in settings.gpu_hour_cost:
        return float(settings.gpu_hour_cost[hw])
    return spec.cluster.gpu_hour_cost


def cost_per_mtok(metrics: dict, price: float | None) -> float | None:
    """Cost of one million trained tokens: price per GPU-hour / (tokens per GPU-hour)."""
    if price is None or not metrics.get("tokens_per_s_per_gpu"):
        return None
    return price / 3600.0 / metrics["tokens_per_s_per_gpu"] * 1e6


def objective_score(metrics: dict, objective: str) -> float:
    if objective == "tokens_per_s_per_gpu":
        return metrics["tokens_per_s_per_gpu"]
    if objective == "step_time":
        return -metrics["step_time_s"]
    cost = metrics.get("cost_per_mtok")
    if cost is None:
        raise ValueError("tune.objective=cost needs a GPU-hour price: set "
                         "cluster.gpu_hour_cost or tune.gpu_hour_cost.<hardware>")
    return -cost


def _memory_options():
    """The memory model's options of ``mode=project`` (no margin on the fit verdict)."""
    from primus_ext.memory.options import MemoryOptions
    return MemoryOptions()


def is_tight(metrics: dict | None, margin: float) -> bool:
    """A fitting peak within ``margin`` of the device (the tuner's memory risk)."""
    if not metrics or not metrics.get("device_bytes"):
        return False
    return metrics["peak_memory_bytes"] * (1 + margin) > metrics["device_bytes"]


class Evaluator:
    """Scores points of one space; each point is evaluated once (cache + journal)."""

    def __init__(self, space: SearchSpace, settings: TuneSettings, *,
                 memory_fn: Callable | None = None, project_fn: Callable | None = None,
                 journal=None, on_trial: Callable | None = None,
                 prefetched: dict | None = None, started: float | None = None):
        self.space, self.settings = space, settings
        # Scores computed elsewhere (tune/shard.py): point -> trial record.
        self.prefetched = prefetched or {}
        self.journal, self.on_trial = journal, on_trial
        self._mem_opts = None
        if memory_fn is None or project_fn is None:
            from primus_ext.project.calibration import Calibration, load_calibration
            calib = settings.calibration
            calib = calib if isinstance(calib, Calibration) else load_calibration(calib)
        if memory_fn is None:
            from primus_ext.memory.report import memory_report
            self._mem_opts = _memory_options()
            opts = self._mem_opts
            # The projector calls memory_report on the calibrated spec with these
            # options: the same call here makes its (cached) report the one we filter on.
            memory_fn = lambda s: memory_report(calib.apply(s), opts)  # noqa: E731
        if project_fn is None:
            from primus_ext.project.estimate import project
            opts = self._mem_opts
            project_fn = lambda s: project(s, calibration=calib,  # noqa: E731
                                           memory_options=opts)
        self.memory_fn, self.project_fn = memory_fn, project_fn
        self.cache: dict[Point, Trial] = {}
        self.trials: list[Trial] = []  # in evaluation order, new and resumed
        self.rejected = Counter()  # reason -> count, for everything not projected
        self.num_checked = 0  # candidates that met the memory model
        # ... of which off the space's axes (the fit ladder's recompute, e.g. block-23)
        self.num_off_axis = 0
        self.num_projected = 0
        # The time budget counts from here, or from ``started`` (tune(): its own start,
        # so that enumerating the space is inside tune.budget.seconds).
        self.start = time.monotonic() if started is None else started
        self.best: Trial | None = None
        self._cap: tuple[int, float] | None = None

    @property
    def memory_options(self):
        """The MemoryOptions its memory model runs with; None for a caller's own model."""
        return self._mem_opts

    # ---- budget -------------------------------------------------------------------
    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.start

    def budget_left(self) -> bool:
        s = self.settings
        if self.num_checked >= s.max_candidates:
            return False
        if self._cap is not None and (self.num_checked >= self._cap[0]
                                      or self.elapsed_s >= self._cap[1]):
            return False
        # A deadline: the next candidate (the mean so far) must end within it.
        per = self.elapsed_s / self.num_checked if self.num_checked else 0.0
        return s.max_seconds is None or self.elapsed_s + per < s.max_seconds

    @contextlib.contextmanager
    def limit(self, candidates: int, seconds: float | None):
        """A share of the budget: at most ``candidates`` more, ``seconds`` more."""
        old = self._cap
        self._cap = (self.num_checked + candidates,
                     self.elapsed_s + (seconds if seconds is not None else float("inf")))
        try:
            yield
        finally:
            self._cap = old

    def remaining(self) -> tuple[int, float | None]:
        s = self.settings
        secs = None if s.max_seconds is None else max(s.max_seconds - self.elapsed_s, 0.0)
        return max(s.max_candidates - self.num_checked, 0), secs

    # ---- resume ---------------------------------------------------------------------
    def preload(self, trial: Trial) -> None:
        """A trial read back from the journal: cached, counted, not re-journaled."""
        if trial.point in self.cache:
            return
        if trial.verdict in ("ok", "oom", "error"):
            self.num_checked += 1
            self.num_off_axis += bool(self.space.in_space(trial.point))
        if trial.verdict == "ok":
            self.num_projected += 1
            trial.metrics.setdefault("cost_per_mtok", None)
            trial.score = objective_score(trial.metrics, self.settings.objective)
        trial.index = -1
        self._record(trial, journal=False)

    # ---- scoring ------------------------------------------------------------------
    def evaluate(self, point: Point, source: str, hypothesis: str | None = None,
                 check_space: bool = False, enforce_budget: bool = True) -> Trial:
        """The trial of ``point`` (normalised first); BudgetExhausted when a new point
        is asked for after the budget is spent (unless ``enforce_budget`` is false: the
        LLM loop and the reference layout bring their own limits)."""
        point = self.space.normalize(point)
        hit = self.cache.get(point)
        if hit is not None and not (hit.verdict == "oom" and source in PUBLISHED_SOURCES):
            return hit
        trial = Trial(point=point, source=source, verdict="ok", hypothesis=hypothesis)
        off_axis = self.space.in_space(point) if check_space else None
        spec = None if off_axis else self.space.spec(point)
        if off_axis:
            trial.verdict, trial.reason = "out_of_space", off_axis
        elif spec is None:
            why = self.space.why(point) or "illegal"
            trial.verdict = "skipped" if why.startswith(("uneven", "zero-bubble")) \
                else "illegal"
            trial.reason = why
        else:
            if enforce_budget and not self.budget_left():
                raise BudgetExhausted()
            self.num_checked += 1
            self.num_off_axis += bool(self.space.in_space(point))
            done = self.prefetched.get(point)
            if done is None:
                self._score(spec, trial, ran=source in PUBLISHED_SOURCES)
            else:
                self._reuse(done, trial)
        self._record(trial, journal=True)
        return trial

    def _score(self, spec: RunSpec, trial: Trial, ran: bool = False) -> None:
        """``ran``: a published layout of the job; it ran, so a memory verdict over the
        device does not reject it (the trial says so: ``memory_over_device``)."""
        margin = self.settings.memory_margin
        try:
            mem = self.memory_fn(spec)
            device = getattr(mem, "device_bytes", None) or spec.cluster.hardware.hbm_bytes
            if self._mem_opts is not None:
                fits = bool(mem.fits)
            else:
                fits = mem.peak_bytes <= device
            if not fits and not ran:
                trial.verdict = "oom"
                trial.reason = (f"peak {mem.peak_bytes / 2**30:.1f} GiB > "
                                f"{device / 2**30:.1f} GiB")
                trial.metrics = {"peak_memory_bytes": mem.peak_bytes,
                                 "device_bytes": device}
                return
            est = self.project_fn(spec)
            self.num_projected += 1
        except Exception as exc:  # noqa: BLE001 - one bad corner must not end a search
            trial.verdict = "error"
            trial.reason = f"{type(exc).__name__}: {exc}"
            return
        metrics = compact_estimate(est, spec, mem.peak_bytes, device)
        metrics["cost_per_mtok"] = cost_per_mtok(metrics, gpu_hour_cost(spec, self.settings))
        metrics["memory_tight"] = is_tight(metrics, margin)
        metrics["memory_over_device"] = not fits
        trial.metrics = metrics
        trial.score = objective_score(metrics, self.settings.objective)

    def _reuse(self, rec: dict, trial: Trial) -> None:
        """A score computed by a shard worker (same space, same settings)."""
        trial.verdict, trial.reason = rec["verdict"], rec.get("reason")
        trial.metrics = rec.get("estimate")
        if trial.verdict == "ok":
            self.num_projected += 1
            trial.score = objective_score(trial.metrics, self.settings.objective)

    def _record(self, trial: Trial, journal: bool) -> None:
        if trial.index < 0:
            trial.index = len(self.trials)
        self.cache[trial.point] = trial
        self.trials.append(trial)
        if trial.verdict != "ok":
            self.rejected[trial.verdict] += 1
        elif self.best is None or trial.score > self.best.score:
            self.best = trial
        if journal and self.journal is not None:
            self.journal.append(trial.to_record())
        if self.on_trial is not None:
            self.on_trial(self)

    def ok_trials(self) -> list[Trial]:
        return sorted((t for t in self.trials if t.verdict == "ok"),
                      key=lambda t: (-t.score, t.index))

    def stats(self) -> dict:
        return {"evaluated": self.num_checked, "off_axis": self.num_off_axis,
                "projected": self.num_projected,
                "rejected_by_reason": dict(self.rejected.most_common()),
                "seconds": self.elapsed_s}
