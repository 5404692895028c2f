"""Published training runs (``data/validation/published_runs.csv``) as RunSpecs.

Pure: no torch, no Hydra. ``read_runs(path)`` turns every row into a ``PublishedRun``:
its raw row, the measured figures, and either a validated ``RunSpec`` or one clear
per-row error. Every assumption made to fill a gap in a row is recorded in ``notes``.

Rules (column conventions: ``data/validation/README.md``):

- Model: the row's model columns win (layers, hidden, ffn_hidden, heads, kv_heads, vocab,
  num_experts, topk, moe_ffn_hidden); the preset matched from the ``model`` column supplies
  what the columns cannot say (MLA, shared experts, dense-first layers, head dim,
  activation, norm, biases, tied embeddings). ``MegatronGPT-*`` rows have no preset and
  are built from the columns with Megatron-LM's GPT defaults.
- Cluster: the ``gpu`` column names a hardware preset; ``num_gpus`` is whole nodes of
  it, or one partial node when smaller than a node.
- Layout: an empty ``tp`` or ``pp`` (the other given) = 1, said; both empty = no layout
  published (published/tuned.py); ``vp`` empty/1/n/a = no interleaving; ``dp`` is derived and checked against the
  column; tp > 1 turns sequence parallelism on (megatron-core requires it for MoE; the
  NeMo / Megatron-Bridge recipes default to it for dense models).
- Batch: empty ``mbs`` -> the recipe's, else the fastest that fits with priors only when
  ``gbs`` is stated (gaps.mbs_if_unstated), else 1; empty ``gbs`` -> from measured step time and tokens/s, else a
  default named in the row's notes, else ``mbs * dp * DEFAULT_MICROBATCHES_PER_STAGE * pp``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Mapping

from primus_ext.presets import hardware_preset
from primus_ext.published.bridge_moe import precision_kind
from primus_ext.published.cells import RowError, _Row
from primus_ext.published.gaps import (MBS_ASSUMED_NOTE, derive_gbs, layout_from_notes,
                                      mbs_if_unstated, recompute_if_needed)
from primus_ext.published.model_columns import model_of
from primus_ext.published.names import hardware_preset_name
from primus_ext.published.recipes import Recipe, RowFacts, attention_flops_halved, recipe_for
from primus_ext.published.recompute import read_recompute
from primus_ext.published.row_facts import flag
from primus_ext.published.torchtitan import is_torchtitan_row, torchtitan_spec
from primus_ext.published.tuned import tuned_layout
from primus_ext.spec import ClusterSpec, ModelSpec, ParallelSpec, RunSpec, TrainSpec
from primus_ext.spec.train import FP8_RECIPES

DEFAULT_PATH = Path(__file__).resolve().parent.parent / "data" / "validation" / "published_runs.csv"


_MEASURED = (("tokens_per_s_per_gpu", "measured_tokens_per_s_per_gpu"),
             ("tflops_per_gpu", "measured_tflops_per_gpu"), ("mfu", "measured_mfu"),
             ("step_time_s", "measured_step_time_s"))


@dataclass(frozen=True, kw_only=True, slots=True)
class Measured:
    """Figures as the source published them (None where the row leaves them empty)."""
    tokens_per_s_per_gpu: float | None = None
    tflops_per_gpu: float | None = None
    mfu: float | None = None
    step_time_s: float | None = None

    # Mapping-style access too (``run.measured.get("mfu")``), for callers that treat the
    # measured figures as a dict keyed by these names.
    def get(self, key: str, default: float | None = None) -> float | None:
        value = getattr(self, key, None) if key in self.__dataclass_fields__ else None
        return default if value is None else value

    def __getitem__(self, key: str) -> float | None:
        if key not in self.__dataclass_fields__:
            raise KeyError(key)
        return getattr(self, key)


@dataclass(frozen=True, kw_only=True, slots=True, eq=False)
class PublishedRun:
    run_id: str
    row: dict  # the raw CSV row
    spec: RunSpec | None
    error: str | None  # why the row cannot become a spec (None when spec is set)
    measured: Measured
    source: str
    gpu: str
    is_moe: bool
    precision: str  # as published (fp16 is kept; the spec computes it at the bf16 peak)
    model_preset: str | None = None
    hardware_preset: str | None = None
    notes: tuple[str, ...] = field(default=())  # assumptions made for this row
    # The source's FLOP formula halves core attention for the causal mask (as ours does);
    # False: Megatron-LM core_r0.8.0's (published/recipes.py FULL_ATTENTION_FLOP_SOURCES).
    flops_causal_halved: bool = True


# ---- one row ------------------------------------------------------------------------
def parse_row(row: Mapping[str, str | None], line: int | None = None) -> PublishedRun:
    """One CSV row as a PublishedRun (spec or error, never an exception)."""
    run_id = (row.get("run_id") or "").strip() or f"line {line}"
    r = _Row(row, run_id)
    notes: list[str] = []
    base = dict(run_id=run_id, row=dict(row), source=r.text("source"), gpu=r.text("gpu"),
                precision=r.text("precision"),
                is_moe=r.text("arch").lower() == "moe" or bool(r.text("num_experts")),
                flops_causal_halved=attention_flops_halved(r.text("source")))
    if not base["flops_causal_halved"]:
        notes.append("published TFLOP/s and MFU by Megatron-LM core_r0.8.0's FLOP formula "
                     "(core attention not halved for the causal mask); measured tokens/s "
                     "recovered with it")
    try:
        measured = Measured(**{k: r.float_(col, positive=True) for k, col in _MEASURED})
    except RowError as exc:
        return PublishedRun(**base, spec=None, error=str(exc), measured=Measured())
    preset = hw_name = None
    if row.get("tp") == row.get("pp") == "":  # both columns present and empty
        return _tuned_layout(row, line, base, measured)
    try:
        model, preset = model_of(r, notes)
        cluster, hw_name = _cluster(r, notes)
        recipe = _recipe(r, model, preset, cluster.world_size)
        if recipe.model:
            model = replace(model, **recipe.model)
        parallel = _parallel(r, model, cluster.world_size, notes, recipe)
        train = _train(r, parallel, cluster.world_size, measured, notes, recipe)
        spec = RunSpec(model=model, parallel=parallel, train=train, cluster=cluster)
    except RowError as exc:
        return PublishedRun(**base, spec=None, error=str(exc), measured=measured,
                            model_preset=preset, hardware_preset=hw_name, notes=tuple(notes))
    except ValueError as exc:  # a spec rule the row's layout breaks
        return PublishedRun(**base, spec=None, error=f"row {run_id}: {exc}",
                            measured=measured, model_preset=preset,
                            hardware_preset=hw_name, notes=tuple(notes))
    if spec.layout.how == "balanced":
        notes.append(f"{spec.layout.describe()} (chosen: layers do not divide pp*vpp and "
                     "the row gives no layout)")
    if MBS_ASSUMED_NOTE in notes and r.text("gbs") \
            and not is_torchtitan_row(r.text("source")):
        spec = mbs_if_unstated(spec, notes)
    if not r.text("recompute"):
        spec = recompute_if_needed(spec, notes, keep=recipe.recompute_from_source)
    if is_torchtitan_row(r.text("source")):
        try:
            spec = torchtitan_spec(spec, dict(row), notes)
        except ValueError as exc:
            return PublishedRun(**base, spec=None, error=f"row {run_id}: {exc}",
                                measured=measured, model_preset=preset,
                                hardware_preset=hw_name, notes=tuple(notes))
    return PublishedRun(**base, spec=spec, error=None, measured=measured,
                        model_preset=preset, hardware_preset=hw_name, notes=tuple(notes))


def _tuned_layout(row, line, base: dict, measured: Measured) -> PublishedRun:
    """A row that publishes no parallel layout: the tuner's (published/tuned.py)."""
    spec, error, notes, preset, hw = tuned_layout(
        tuple(sorted((k, v or "") for k, v in row.items())), line, parse_row)
    return PublishedRun(**base, spec=spec, error=error, measured=measured,
                        model_preset=preset, hardware_preset=hw, notes=notes)


def _recipe(r: _Row, model: ModelSpec, preset: str | None, world: int) -> Recipe:
    """The source's documented recipe facts for this row (published_recipes.py)."""
    tp, pp, cp = r.int_("tp") or 1, r.int_("pp") or 1, r.int_("cp") or 1
    facts = RowFacts(source=r.text("source"), source_detail=r.text("source_detail"),
                     model_preset=preset, gpu=r.text("gpu"),
                     notes=r.text("notes"), num_layers=model.num_layers,
                     is_moe=model.is_moe, tp=tp, pp=pp, cp=cp,
                     dp=max(world // (tp * pp * cp), 1), vpp=r.int_("vp") or 1,
                     vp_stated=bool(r.text("vp")), mbs_stated=bool(r.text("mbs")),
                     mbs=r.int_("mbs"), ep=r.int_("ep") or 1,
                     gbs=r.int_("gbs"), seq=r.int_("seq_len") or 0,
                     recompute_stated=bool(r.text("recompute")),
                     precision=r.text("precision").lower(),
                     sharding=r.text("fsdp_or_zero").lower())
    return recipe_for(facts)


def _cluster(r: _Row, notes: list[str]) -> tuple[ClusterSpec, str]:
    gpu = r.text("gpu", required=True)
    hw_name = hardware_preset_name(gpu)
    try:
        hw = hardware_preset(hw_name)
    except ValueError as exc:
        raise r.fail("gpu", f"{gpu!r} -> {exc}") from None
    num_gpus = r.int_("num_gpus", required=True)
    if num_gpus < 1:
        raise r.fail("num_gpus", f"{num_gpus} must be positive")
    per_node = hw.gpus_per_node
    if num_gpus % per_node == 0:
        return ClusterSpec(hardware=hw, num_nodes=num_gpus // per_node), hw_name
    if num_gpus < per_node:
        notes.append(f"num_gpus={num_gpus} < {per_node} GPUs per {hw_name} node: one "
                     f"partial node of {num_gpus}")
        return ClusterSpec(hardware=hw, num_nodes=1, gpus_per_node=num_gpus), hw_name
    raise r.fail("num_gpus", f"{num_gpus} is neither a multiple of the {per_node} GPUs of "
                 f"a {hw_name} node nor smaller than one node")


_CURRENT_SCALING = re.compile(r"current[- ]scaling", re.I)


def _parallel(r: _Row, model: ModelSpec, world: int, notes: list[str],
              recipe: Recipe) -> ParallelSpec:
    for column in ("tp", "pp"):
        r.text(column, required=r.row.get(column) is None)  # an absent column is an error
        if r.text(column) == "":
            notes.append(f"{column} empty: 1 assumed (the other parallel column is given)")
    tp, pp = r.int_("tp") or 1, r.int_("pp") or 1
    vp_text = r.text("vp")
    vpp = r.int_("vp") or 1
    if not vp_text and pp > 1 and "vpp" not in recipe.parallel:
        notes.append("vp empty (not stated): no interleaving assumed")
    cp = r.int_("cp")
    ep = r.int_("ep")
    if cp is None:
        cp = 1
        notes.append("cp empty: 1 assumed")
    ep = 1 if ep is None else ep
    etp = r.int_("etp")
    if etp is None and model.is_moe:
        etp = 1
        notes.append("etp empty: expert_tensor_parallel_size=1 (the Megatron-Bridge / NeMo "
                     "MoE recipes' setting)")
    for column, v in (("tp", tp), ("pp", pp), ("vp", vpp), ("cp", cp), ("ep", ep)):
        if v < 1:
            raise r.fail(column, f"{v} must be positive")
    mp = tp * pp * cp
    if world % mp:
        raise r.fail("num_gpus", f"{world} GPUs are not divisible by tp*pp*cp="
                     f"{tp}*{pp}*{cp}={mp}")
    dp = world // mp
    dp_col = r.int_("dp")
    if dp_col is not None and dp_col != dp:
        raise r.fail("dp", f"{dp_col} differs from num_gpus/(tp*pp*cp)={world}/{mp}={dp}")
    kwargs: dict = dict(tp=tp, pp=pp, vpp=vpp, cp=cp, ep=ep, etp=etp,
                        sequence_parallel=tp > 1)
    if tp > 1:
        notes.append("sequence_parallel=True (tp>1: required by megatron-core for MoE, "
                     "default of the NeMo/Megatron-Bridge recipes for dense models)")
    sharding = r.text("fsdp_or_zero").lower()
    if not is_torchtitan_row(r.text("source")) and flag(r, "tp_comm_overlap", notes):
        kwargs["tp_comm_overlap"] = True
        notes.append("tp_comm_overlap=True (the row states TP comm overlap on)")
    if sharding.startswith("fsdp") and pp > 1:
        # Sharded data parallelism next to a pipeline keeps parameters gathered across
        # the microbatches (Llama 3 paper Sec. 3.3.2: no reshard after forward; the
        # torchtitan default with PP does the same), so it
        # communicates like the distributed optimizer: one gradient reduce-scatter and
        # one parameter all-gather per step. Its unsharded gradients are FSDP's, made in
        # the backward (not a buffer allocated at start-up) and reduce-scattered into
        # the shards after the last microbatch.
        kwargs["use_distributed_optimizer"] = True
        titan = is_torchtitan_row(r.text("source"))  # FSDP2: memory/torchtitan.py
        if not titan:
            kwargs["grad_buffer"] = "on_backward"
        notes.append(f"fsdp_or_zero={sharding!r} with pp={pp}: parameters stay gathered "
                     "across microbatches; modelled as the distributed optimizer (ZeRO-1/2)"
                     + ("" if titan else " with FSDP's gradients: unsharded from a chunk's "
                        "first backward to its last (grad_buffer=on_backward), sharded "
                        "after"))
    elif sharding.startswith("fsdp") or "zero2" in sharding or "zero3" in sharding:
        kwargs["fsdp"] = True
        if "zero2" in sharding:
            kwargs["fsdp_reshard_after_forward"] = False
            notes.append(f"fsdp_or_zero={sharding!r}: fsdp_reshard_after_forward=False "
                         "(parameters kept gathered from the forward to the backward: no "
                         "backward all-gather)")
    elif sharding in ("", "none", "none(ddp)", "ddp") or sharding.startswith(
            ("zero1", "distributed-optimizer")):
        kwargs["use_distributed_optimizer"] = True
        if not sharding.startswith(("zero1", "distributed-optimizer")):
            notes.append(f"fsdp_or_zero={sharding or '(empty)'}: Megatron DDP with the "
                         "distributed optimizer (default of these recipes; not stated)")
    else:
        raise r.fail("fsdp_or_zero", f"{sharding!r} is not one of fsdp*, zero1, "
                     "distributed-optimizer*, none(ddp), none")
    layout = layout_from_notes(r.text("notes"))
    if layout:
        kwargs.update(layout)
        notes.append(f"pipeline layout from the row's notes: {layout}")
    # The row's own statements (vp column, layout in its notes) win over recipe rules.
    skip = {"vpp"} if vp_text else set()
    if layout:
        skip |= {"pipeline_layout", "vpp"}
    kwargs.update({k: v for k, v in recipe.parallel.items() if k not in skip})
    notes += [n for n in recipe.notes if n.split("=")[0] in recipe.parallel
              and n.split("=")[0] not in skip]
    try:
        return ParallelSpec(**kwargs)
    except ValueError as exc:
        raise RowError(f"row {r.run_id}: {exc}") from None


def _train(r: _Row, par: ParallelSpec, world: int, measured: Measured,
           notes: list[str], recipe: Recipe) -> TrainSpec:
    seq = r.int_("seq_len", required=True)
    dp = world // par.model_parallel_size
    mbs = r.int_("mbs")
    if mbs is None:
        mbs = recipe.train.get("micro_batch_size", 1)
        if "micro_batch_size" not in recipe.train:
            notes.append(MBS_ASSUMED_NOTE)
    per_step = mbs * dp
    gbs = r.int_("gbs")
    if gbs is None:
        gbs = derive_gbs(r, per_step, par.pp, world, seq, measured, notes)
    precision = r.text("precision").lower()
    if not precision:
        precision = "bf16"
        notes.append("precision empty: bf16 assumed")
    elif precision == "fp16":
        notes.append("precision fp16: computed at the bf16 peak (same tensor-core rate)")
    elif precision not in ("bf16", "fp8", "fp32"):
        raise r.fail("precision", f"{precision!r} is not one of bf16, fp8, fp16, fp32")
    stated_recipe = r.text("fp8_recipe").lower()
    if stated_recipe:
        if stated_recipe not in FP8_RECIPES:
            raise r.fail("fp8_recipe", f"{stated_recipe!r} is not one of "
                         f"{', '.join(FP8_RECIPES)}")
        if precision != "fp8":
            raise r.fail("fp8_recipe", f"{stated_recipe!r} with precision {precision!r} "
                         "(an FP8 recipe needs precision fp8)")
        recipe.train["fp8_recipe"] = stated_recipe
        recipe.notes[:] = [n for n in recipe.notes if not n.startswith("fp8_recipe=")]
        notes.append(f"fp8_recipe={stated_recipe} (column fp8_recipe)")
    elif precision == "fp8" and "fp8_recipe" not in recipe.train:
        if precision_kind(precision, r.text("notes")) == "fp8_mx":
            recipe.train["fp8_recipe"] = "mxfp8"
            notes.append("fp8_recipe=mxfp8 (the row's notes: MXFP8, 1x32-block scaling)")
        elif _CURRENT_SCALING.search(r.text("notes")):
            notes.append("fp8_recipe=tensorwise (the row's notes: per-tensor current "
                         "scaling)")
        else:
            notes.append("fp8_recipe=tensorwise (not stated; Megatron-Bridge perf_recipes/"
                         "_common.py _perf_precision('fp8_cs'): FP8 current scaling)")
    recompute = r.text("recompute")
    if recompute == "":
        kwargs = {k: v for k, v in recipe.train.items() if k.startswith("recompute_")}
        if not recipe.sets_recompute:
            notes.append("recompute empty (not stated): none assumed")
    else:
        try:
            kwargs, how = read_recompute(recompute)
        except ValueError as exc:
            raise r.fail("recompute", str(exc)) from None
        if how:
            notes.append(how)
    # What the recipe says selective recompute means (recompute_modules) applies to a row
    # that states "selective" without naming modules; granularity, method and layers
    # come from the row.
    kwargs.update({k: v for k, v in recipe.train.items()
                   if k not in ("recompute_granularity", "recompute_method",
                                "recompute_num_layers", "micro_batch_size")
                   and not (k == "recompute_modules" and k in kwargs)})
    notes += [n for n in recipe.notes if n.split("=")[0] not in recipe.parallel]
    try:
        return TrainSpec(seq_length=seq, micro_batch_size=mbs, global_batch_size=gbs,
                         precision=precision, **kwargs)
    except ValueError as exc:
        raise RowError(f"row {r.run_id}: {exc}") from None


# The whole-file reader lives in files.py (re-exported here: callers import it from here).
from primus_ext.published.files import read_runs  # noqa: E402,F401
