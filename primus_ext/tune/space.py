"""The search space: layout axes around a fixed job, and the legal candidates in it.

The job is fixed by the base RunSpec: model, global batch, sequence length, precision
(unless ``space.precision`` lists more) and cluster (unless ``space.num_nodes`` /
``space.hardware`` list more, for cluster planning). A candidate is a *point*: one value
per axis of ``AXES``. Points are normalised first (values that cannot matter collapse,
e.g. sequence parallelism at tp=1), so every legal point is one distinct RunSpec.

Legality is ``RunSpec`` construction, i.e. ``check_run`` plus the spec dataclasses'
own rules: one rule set for the CLI, the published-run reader and the tuner. On top of
it the tuner skips zero-bubble with virtual stages (counted apart), and uneven pipeline
splits when ``tune.space.uneven_layouts=false``. Where the layers do not divide over a
point's pipeline, the point states the split Megatron-LM accepts (tune/splits.py:
``--decoder-first/last-pipeline-num-layers`` or the account-for-embedding/loss flags).

Settings the job left unstated (``TuneSettings.unstated``) follow the recipe rules
(presets/recipe_defaults.py) at each candidate's own layout, as a composed config and the
published-run reader fill them: TP communication overlap is on at every TP > 1 with
sequence parallelism and TE layers, whatever the starting layout.
"""
from __future__ import annotations

import dataclasses
import itertools
from collections import Counter
from typing import Iterable

from primus_ext.presets import hardware_preset, recipe_defaults
from primus_ext.spec import ClusterSpec, RunSpec, uses_te
# Point helpers are re-exported: callers import them from the space.
from primus_ext.tune.points import (_EP, _ETP, _OPG, _PP, _SCHED, _SHARD, _SP,  # noqa: F401
                                    _TP, _TPO, _VPP, AXES, IDX, SHARDINGS, TITAN_CHECKPOINTS,
                                    TITAN_SHARDINGS, Point, as_dict, candidate_from_dict,
                                    describe, parse_recompute, point_of, recompute_label,
                                    sharding_of)
from primus_ext.tune.settings import SpaceSettings
from primus_ext.tune.space_util import _divisors, _memo, _pow2_upto, _reason_key, _uniq
from primus_ext.tune.splits import NO_SPLIT, megatron_split, pp_sizes

_UNEVEN_FIELDS = ("pipeline_layout", "decoder_first_pipeline_num_layers",
                  "decoder_last_pipeline_num_layers")


class SearchSpace:
    """The axes around ``base`` and their legal points (enumerated lazily, once)."""

    def __init__(self, base: RunSpec, settings: SpaceSettings | None = None,
                 unstated: Iterable[str] = ()):
        self.base = base
        self.settings = settings or SpaceSettings()
        # TP comm overlap follows the recipe rule per candidate (unless the axis is given).
        self.recipe_tpo = ("tp_comm_overlap" in tuple(unstated) and not self.titan
                           and self.settings.get("tp_comm_overlap") is None)
        self._te = uses_te(base)
        self._base_cluster = {(base.cluster.num_nodes, base.cluster.hardware.name):
                              base.cluster}
        self.uneven = self._uneven_allowed()
        self.axes: dict[str, tuple] = self._axes()
        self._specs: dict[Point, RunSpec | None] = {}
        self._why: dict[Point, str] = {}
        self._legal: list[Point] | None = None
        self._parts: dict = {}
        self.num_raw = 1
        for vals in self.axes.values():
            self.num_raw *= len(vals)
        self.illegal_reasons: Counter = Counter()
        self.skipped_reasons: Counter = Counter()

    # ---- axes --------------------------------------------------------------------
    @property
    def titan(self) -> bool:
        return self.base.framework == "torchtitan"

    def _uneven_allowed(self) -> bool:
        if self.titan:
            return True  # torchtitan splits layers its own way (spec/torchtitan.py)
        u = self.settings.uneven_layouts
        if u != "auto":
            return bool(u)
        return True  # the split Megatron-LM accepts (tune/splits.py)

    def _axes(self) -> dict[str, tuple]:
        base, user = self.base, self.settings
        model, bp, bt = base.model, base.parallel, base.train
        base_point = as_dict(point_of(base))
        nodes = user.get("num_nodes") or (base.cluster.num_nodes,)
        hws = user.get("hardware") or (base.cluster.hardware.name,)
        clusters = [self.cluster(n, h) for n in nodes for h in hws]
        node = max(c.node_size for c in clusters)
        world = max(c.world_size for c in clusters)
        layers = model.num_layers
        pp = [d for d in _divisors(layers) if d <= world]
        vpp = [1] + [d for d in _divisors(layers) if 2 <= d <= 8]
        if self.uneven:
            pp = pp_sizes(layers, world) if not self.titan else sorted(
                set(pp) | set(_pow2_upto(min(world, layers, 32))))
            vpp = sorted(set(vpp) | {2, 3, 4})
        seq = bt.seq_length
        cp = [c for c in _pow2_upto(node) if seq // c >= 2048] or [1]
        if model.is_moe:
            ep = [d for d in _divisors(model.num_moe_experts) if d <= world]
            etp = [1, None]
        else:
            ep, etp = [1], [None]
        gran = user.get("recompute_granularity") or (None, "selective", "full")
        methods = user.get("recompute_method") or ("uniform",)
        nums = user.get("recompute_num_layers") or (1,)
        recompute = []
        for g in gran:
            if g == "full":
                recompute += [recompute_label("full", m, n) for m in methods for n in nums]
            else:
                recompute.append(recompute_label(g))
        sharding = ["distributed_optimizer", "fsdp"]
        if self.titan:
            recompute = list(user.get("recompute_granularity") or TITAN_CHECKPOINTS)
            # HSDP only when asked (tune.space.sharding): its replicate all-reduce is not
            # in the cost model (project/torchtitan.py).
            sharding = ["fsdp"]
            etp = [None]
        defaults = {
            "num_nodes": tuple(nodes), "hardware": tuple(hws),
            "tp": _pow2_upto(min(node, model.num_attention_heads)), "pp": pp, "vpp": vpp,
            "cp": cp, "ep": ep, "etp": etp,
            "micro_batch_size": [m for m in (1, 2, 4, 8) if m <= bt.global_batch_size],
            "recompute": recompute, "sharding": sharding,
            "sequence_parallel": [True], "overlap_grad_reduce": [True],
            "overlap_param_gather": [True],
            "tp_comm_overlap": [True] if self.recipe_tpo else [bp.tp_comm_overlap],
            "schedule": ["auto"], "precision": [bt.precision],
        }
        # The baseline's own values belong to the default axes (it is a candidate too).
        with_base = ("tp", "pp", "vpp", "cp", "ep", "etp", "micro_batch_size",
                     "recompute", "sharding", "schedule")
        axes = {}
        recompute_given = any(user.get(k) for k in ("recompute_granularity",
                                                    "recompute_method",
                                                    "recompute_num_layers"))
        for a in AXES:
            given = user.get(a) if a != "recompute" else (tuple(recompute)
                                                          if recompute_given else None)
            if given is not None:
                vals = tuple(given)
            else:
                vals = tuple(defaults[a])
                if a in with_base:
                    vals = _uniq(list(vals) + [base_point[a]])
            axes[a] = self._check_axis(a, vals)
        return axes

    def _check_axis(self, axis: str, vals: tuple) -> tuple:
        for v in vals:
            if self.titan and axis in ("recompute", "sharding"):
                allowed = TITAN_CHECKPOINTS if axis == "recompute" else TITAN_SHARDINGS
                if v not in allowed:
                    raise ValueError(f"tune.space.{axis} value {v!r} must be one of "
                                     f"{', '.join(allowed)} with framework=torchtitan")
            elif axis == "recompute":
                parse_recompute(v)
            elif axis == "sharding" and v not in SHARDINGS:
                raise ValueError(f"tune.space.sharding value {v!r} must be one of "
                                 f"{', '.join(SHARDINGS)}")
            elif axis == "hardware":
                hardware_preset(v)  # raises a clear error for an unknown preset
            elif axis in ("tp", "pp", "vpp", "cp", "ep", "micro_batch_size", "num_nodes"):
                if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                    raise ValueError(f"tune.space.{axis} value {v!r} must be a positive "
                                     "integer")
        return _uniq(vals)

    # ---- points -> specs ----------------------------------------------------------
    def cluster(self, num_nodes: int, hardware: str) -> ClusterSpec:
        key = (num_nodes, hardware)
        hit = self._base_cluster.get(key)
        if hit is None:
            base = self.base.cluster
            if hardware == base.hardware.name:
                hit = dataclasses.replace(base, num_nodes=num_nodes)
            else:
                hit = ClusterSpec(hardware=hardware_preset(hardware), num_nodes=num_nodes,
                                  gpu_hour_cost=base.gpu_hour_cost)
            self._base_cluster[key] = hit
        return hit

    def normalize(self, point: Point) -> Point:
        # Index-based: this runs for every raw point of the space.
        d = list(point)
        if d[_TP] == 1:
            d[_SP] = False
        if self.recipe_tpo:
            d[_TPO] = recipe_defaults.tp_comm_overlap(d[_TP], bool(d[_SP]), self._te)
        elif not d[_SP]:
            d[_TPO] = False  # TE's userbuffer overlap needs SP
        if not self.base.model.is_moe:
            d[_EP], d[_ETP] = 1, None
        elif d[_ETP] == d[_TP]:
            d[_ETP] = None  # Megatron's default: expert TP = TP
        if d[_PP] == 1:
            d[_VPP] = 1
            d[_SCHED] = "auto"
        elif d[_SCHED] in ("1f1b", "interleaved"):
            d[_SCHED] = "auto"
        if d[_SHARD] in ("none", "torch_fsdp2"):
            d[_OPG] = False  # Megatron-LM: distributed optimizer or Megatron-FSDP only
        if self.titan and d[_SHARD] == "hsdp" and d[IDX["num_nodes"]] == 1:
            d[_SHARD] = "fsdp"  # one replica: HSDP is FSDP
        return tuple(d)

    def spec(self, point: Point) -> RunSpec | None:
        """The RunSpec of a normalised point, or None (see ``why``)."""
        if point in self._specs:
            return self._specs[point]
        spec = None
        try:
            reason = self._skip(point)
            if reason:
                self._why[point] = reason
                self.skipped_reasons[reason] += 1
            else:
                spec = self._build(point)
        except ValueError as exc:
            reason = _reason_key(str(exc))
            self._why[point] = str(exc)
            self.illegal_reasons[reason] += 1
        self._specs[point] = spec
        return spec

    def why(self, point: Point) -> str | None:
        return self._why.get(point)

    def _skip(self, point: Point) -> str | None:
        pp, vpp = point[_PP], point[_VPP]
        if self.titan:
            return None
        if point[_SCHED] == "zb" and vpp > 1:
            return "zero-bubble schedule with vpp > 1"
        if self.base.model.num_layers % (pp * vpp) and (
                (pp, vpp) != (self.base.parallel.pp, self.base.parallel.vpp)):
            if not self.uneven:
                return "uneven pipeline split (tune.space.uneven_layouts=false)"
            if megatron_split(self.base.model.num_layers, pp, vpp) is None:
                return "uneven pipeline split that Megatron-LM does not accept"
        return None

    def _build(self, point: Point) -> RunSpec:
        if self.titan:
            from primus_ext.tune.torchtitan import build_titan_spec
            return build_titan_spec(self, point)
        d = as_dict(point)
        base = self.base
        bp = base.parallel
        g, method, num = parse_recompute(d["recompute"])
        sharding = d["sharding"]
        if sharding not in SHARDINGS:
            raise ValueError(f"sharding={sharding!r} must be one of {', '.join(SHARDINGS)}")
        kwargs = dict(tp=d["tp"], pp=d["pp"], vpp=d["vpp"], cp=d["cp"], ep=d["ep"],
                      etp=d["etp"], sequence_parallel=d["sequence_parallel"],
                      fsdp=sharding in ("fsdp", "torch_fsdp2"),
                      fsdp_impl=("torch_fsdp2" if sharding == "torch_fsdp2"
                                 else "megatron_fsdp"),
                      use_distributed_optimizer=sharding == "distributed_optimizer",
                      overlap_grad_reduce=d["overlap_grad_reduce"],
                      overlap_param_gather=d["overlap_param_gather"],
                      tp_comm_overlap=d["tp_comm_overlap"], schedule=d["schedule"])
        if (d["pp"], d["vpp"]) != (bp.pp, bp.vpp):
            kwargs.update({f: None for f in _UNEVEN_FIELDS})
            # The split Megatron-LM accepts for this pipeline (the plain one when the
            # layers divide).
            kwargs.update(megatron_split(base.model.num_layers, d["pp"], d["vpp"])
                          or NO_SPLIT)
        # Many points share their parallel or training part: build each part once.
        par = _memo(self._parts, ("parallel",) + tuple(kwargs.items()),
                    lambda: dataclasses.replace(bp, **kwargs))
        tkw = dict(micro_batch_size=d["micro_batch_size"], recompute_granularity=g,
                   recompute_method=method, recompute_num_layers=num,
                   precision=d["precision"])
        train = _memo(self._parts, ("train",) + tuple(tkw.items()),
                      lambda: dataclasses.replace(base.train, **tkw))
        cluster = self.cluster(d["num_nodes"], d["hardware"])
        return RunSpec(model=base.model, parallel=par, train=train, cluster=cluster,
                       framework=base.framework)

    # ---- enumeration --------------------------------------------------------------
    def legal_points(self) -> list[Point]:
        """Every legal, distinct, normalised point, in axis order (deterministic)."""
        if self._legal is None:
            seen: set = set()
            legal = []
            for raw in itertools.product(*(self.axes[a] for a in AXES)):
                point = self.normalize(raw)
                if point in seen:
                    continue
                seen.add(point)
                if self.spec(point) is not None:
                    legal.append(point)
            self.num_distinct = len(seen)
            self._legal = legal
        return self._legal

    @property
    def num_legal(self) -> int:
        return len(self.legal_points())

    def vary(self, point: Point, **changes) -> Point:
        """``point`` with ``changes``, the other axes snapped onto the space (a value
        normalisation had forced, like no SP at tp=1, takes the axis's value again)."""
        d = as_dict(point)
        d.update(changes)
        return self.snap(tuple(d[a] for a in AXES))

    def snap(self, point: Point) -> Point:
        """``point`` with every off-axis value moved onto its axis (the nearest number,
        else the axis's first value), normalised."""
        d = as_dict(point)
        for a in AXES:
            vals = self.axes[a]
            if d[a] in vals or self._forced(a, point):
                continue
            nums = [v for v in vals if isinstance(v, int) and not isinstance(v, bool)]
            if nums and isinstance(d[a], int) and not isinstance(d[a], bool):
                d[a] = min(nums, key=lambda v: (abs(v - d[a]), v))
            else:
                d[a] = vals[0]
        return self.normalize(tuple(d[a] for a in AXES))

    def in_space(self, point: Point) -> str | None:
        """None when every value of ``point`` is on its axis (or forced by
        normalisation), else why not."""
        for a, v in zip(AXES, point):
            if v not in self.axes[a] and not self._forced(a, point):
                return f"{a}={v!r} is not on the axis {list(self.axes[a])}"
        return None

    def _forced(self, axis: str, point: Point) -> bool:
        """Whether normalisation sets this value whatever the axis lists."""
        d = as_dict(point)
        v = d[axis]
        dense = not self.base.model.is_moe
        return ((axis == "sequence_parallel" and not v and d["tp"] == 1)
                or (axis == "tp_comm_overlap" and (self.recipe_tpo or (
                    not v and not d["sequence_parallel"])))
                or (axis == "etp" and v is None and (dense or d["tp"] in self.axes["etp"]))
                or (axis == "ep" and v == 1 and dense)
                or (axis == "vpp" and v == 1 and d["pp"] == 1)
                or (axis == "schedule" and v == "auto"
                    and (d["pp"] == 1 or bool({"1f1b", "interleaved"} & set(self.axes[axis]))))
                or (axis == "overlap_param_gather" and not v
                    and d["sharding"] in ("none", "torch_fsdp2")))

    def summary(self) -> dict:
        self.legal_points()
        return {"axes": {a: list(v) for a, v in self.axes.items()},
                "num_raw": self.num_raw, "num_distinct": self.num_distinct,
                "num_legal": len(self._legal),
                "illegal_by_reason": dict(self.illegal_reasons.most_common()),
                "skipped_by_reason": dict(self.skipped_reasons.most_common())}


def unstated_settings(spec: RunSpec, settings) -> tuple[str, ...]:
    """The recipe settings each candidate takes at its own layout: those the composed
    config left null (``TuneSettings.unstated``), or, for a RunSpec given directly, those
    whose value is the recipe rule's at the spec's own layout."""
    if settings.unstated is not None:
        return tuple(settings.unstated)
    p = spec.parallel
    rule = recipe_defaults.tp_comm_overlap(p.tp, p.sequence_parallel, uses_te(spec))
    return ("tp_comm_overlap",) if p.tp_comm_overlap == rule else ()


def space_of(spec: RunSpec, settings) -> SearchSpace:
    """The search space of a tuning run (TuneSettings ``settings``)."""
    return SearchSpace(spec, settings.space, unstated=unstated_settings(spec, settings))
