"""TuneSettings: what the tuner searches, how, under which budget, and where it writes.

Built from the plain dict of the ``tune`` config group (``TuneSettings.from_dict``), so
the core stays free of Hydra; every field has the default of ``hydra_conf/tune``.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping

_OWNER = "tune"
# Settings the user types under another key (tune.budget.*).
_KEYS = {"max_candidates": "budget.candidates", "max_seconds": "budget.seconds"}
STRATEGIES = ("auto", "exhaustive", "guided")
OBJECTIVES = ("tokens_per_s_per_gpu", "step_time", "cost")
BACKENDS = ("simulate", "hybrid")
SPACE_AXES = ("tp", "pp", "vpp", "cp", "ep", "etp", "micro_batch_size",
              "recompute_granularity", "recompute_method", "recompute_num_layers",
              "sharding", "sequence_parallel", "overlap_grad_reduce",
              "overlap_param_gather", "tp_comm_overlap", "schedule", "precision",
              "num_nodes", "hardware")


@dataclass(frozen=True, kw_only=True, slots=True)
class SpaceSettings:
    """User restrictions of the search axes: None = the default for model and cluster."""
    values: Mapping[str, tuple | None] = field(default_factory=dict)
    uneven_layouts: str | bool = "auto"

    def __post_init__(self) -> None:
        for name, vals in self.values.items():
            if name not in SPACE_AXES:
                raise ValueError(f"tune.space.{name} is not a search axis; axes: "
                                 f"{', '.join(SPACE_AXES)}")
            if vals is not None and len(vals) == 0:
                raise ValueError(f"tune.space.{name}=[] is empty; give at least one value "
                                 "or null for the default")
        if self.uneven_layouts not in ("auto", True, False):
            raise ValueError(f"tune.space.uneven_layouts={self.uneven_layouts!r} must be "
                             "auto, true or false")

    def get(self, axis: str) -> tuple | None:
        return self.values.get(axis)


@dataclass(frozen=True, kw_only=True, slots=True)
class LLMSettings:
    enabled: bool = False
    model: str = "gpt-4o-mini"
    base_url: str | None = None  # None -> OPENAI_BASE_URL
    api_key: str | None = None  # None -> OPENAI_API_KEY
    timeout_s: float = 60.0
    max_rounds: int = 4
    candidates_per_round: int = 5
    max_failures: int = 2
    temperature: float = 0.2
    top_trials: int = 8

    def __post_init__(self) -> None:
        if not isinstance(self.enabled, bool):
            raise ValueError(f"tune.llm.enabled={self.enabled!r} must be a boolean (true or "
                             "false)")
        for f in ("max_rounds", "candidates_per_round", "max_failures", "top_trials"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"tune.llm.{f}={v!r} must be a positive integer")
        if not self.timeout_s or self.timeout_s <= 0:
            raise ValueError(f"tune.llm.timeout_s={self.timeout_s!r} must be positive")


@dataclass(frozen=True, kw_only=True, slots=True)
class TuneSettings:
    strategy: str = "auto"
    objective: str = "tokens_per_s_per_gpu"
    memory_margin: float = 0.05
    max_candidates: int = 1500
    max_seconds: float | None = 60.0
    restarts: int = 5
    top_k: int = 10
    out_dir: str | None = None  # None -> no recipe written (Python API) or a default
    resume: bool = False
    overwrite: bool = False  # replace an existing journal in out_dir (resume: continue it)
    reference: str | None = "auto"
    backend: str = "simulate"
    hybrid_top_k: int = 5
    profile: str | None = None  # measured profile for backend=hybrid
    calibration: Any = "default"
    progress: bool = True
    gpu_hour_cost: Mapping[str, float] = field(default_factory=dict)
    space: SpaceSettings = field(default_factory=SpaceSettings)
    llm: LLMSettings = field(default_factory=LLMSettings)
    # Parallel settings the job left unstated (null): each candidate gets the recipe
    # rule's value at its own layout (presets/recipe_defaults.py UNSTATED_PARALLEL).
    # None: a setting whose value is the rule's at the job's own layout follows the rule.
    unstated: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ValueError(f"tune.strategy={self.strategy!r} must be one of "
                             f"{', '.join(STRATEGIES)}")
        if self.objective not in OBJECTIVES:
            raise ValueError(f"tune.objective={self.objective!r} must be one of "
                             f"{', '.join(OBJECTIVES)}")
        if self.backend not in BACKENDS:
            raise ValueError(f"tune.backend={self.backend!r} must be one of "
                             f"{', '.join(BACKENDS)}")
        if not 0 <= self.memory_margin < 1:
            raise ValueError(f"tune.memory_margin={self.memory_margin!r} must be in [0, 1)")
        for f in ("max_candidates", "restarts", "top_k", "hybrid_top_k"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"tune.{_KEYS.get(f, f)}={v!r} must be a positive integer")
        for f in ("resume", "overwrite", "progress"):
            if not isinstance(getattr(self, f), bool):
                raise ValueError(f"tune.{f}={getattr(self, f)!r} must be a boolean (true or "
                                 "false)")
        if self.resume and self.overwrite:
            raise ValueError("tune.resume=true and tune.overwrite=true exclude each other: "
                             "continue the journal or replace it")
        if self.max_seconds is not None and (
                isinstance(self.max_seconds, bool)
                or not isinstance(self.max_seconds, (int, float)) or not self.max_seconds > 0):
            raise ValueError(f"tune.budget.seconds={self.max_seconds!r} must be positive "
                             "or null")
        for hw, cost in self.gpu_hour_cost.items():
            if isinstance(cost, bool) or not isinstance(cost, (int, float)) or cost < 0:
                raise ValueError(f"tune.gpu_hour_cost.{hw}={cost!r} must be a "
                                 "non-negative number")

    def replace(self, **changes) -> "TuneSettings":
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None, **extra) -> "TuneSettings":
        """Settings from the plain ``tune`` group (as ``OmegaConf.to_container`` gives it)."""
        data = dict(data or {})
        known = {f.name for f in dataclasses.fields(cls)} | {"budget"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"tune.{unknown[0]} is not a tuner setting; known: "
                             f"{', '.join(sorted(known - {'max_candidates', 'max_seconds'}))}")
        budget = data.pop("budget", None) or {}
        bad = sorted(set(budget) - {"candidates", "seconds"})
        if bad:
            raise ValueError(f"tune.budget.{bad[0]} is not a budget key (candidates, seconds)")
        if "candidates" in budget:
            data["max_candidates"] = budget["candidates"]
        if "seconds" in budget:
            data["max_seconds"] = budget["seconds"]
        space = dict(data.pop("space", None) or {})
        uneven = space.pop("uneven_layouts", "auto")
        values = {k: _as_tuple(k, v) for k, v in space.items()}
        data["space"] = SpaceSettings(values=values, uneven_layouts=uneven)
        llm = dict(data.pop("llm", None) or {})
        llm_known = {f.name for f in dataclasses.fields(LLMSettings)}
        bad = sorted(set(llm) - llm_known)
        if bad:
            raise ValueError(f"tune.llm.{bad[0]} is not an LLM setting; known: "
                             f"{', '.join(sorted(llm_known))}")
        data["llm"] = LLMSettings(**llm)
        data["gpu_hour_cost"] = {k: v for k, v in (data.get("gpu_hour_cost") or {}).items()
                                 if v is not None}
        data.update(extra)
        return cls(**data)


def _as_tuple(axis: str, value) -> tuple | None:
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        return tuple(value)
    return (value,)  # a scalar restricts the axis to one value
