"""Hydra edge: compose the config tree and turn a composed config into a RunSpec.

``compose(overrides)`` is the Python twin of the CLI: the same config tree, the same
overrides, the same validation.
"""
from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Any, Mapping

from omegaconf import DictConfig, OmegaConf

from primus_ext.presets import _conf_dir, hardware_preset, list_presets
from primus_ext.presets.recipe_defaults import fill_unstated_parallel
from primus_ext.spec import (ClusterSpec, HardwareSpec, ModelSpec, ParallelSpec, RunSpec,
                             TrainSpec)

# ${primus_tp_gt_one:${parallel.tp}}: the default of parallel.sequence_parallel (on when
# tensor parallelism is, as in the NeMo / Megatron-Bridge recipes).
if not OmegaConf.has_resolver("primus_tp_gt_one"):
    # A tp that is not an integer resolves to False here, so that the error names
    # parallel.tp (the spec's type check) and not this derived default.
    OmegaConf.register_new_resolver(
        "primus_tp_gt_one", lambda tp: isinstance(tp, int) and not isinstance(tp, bool)
        and tp > 1)

def conf_dir() -> Path:
    return _conf_dir()


def compose_cfg(overrides: list[str] | tuple[str, ...] = ()) -> DictConfig:
    """The composed config for ``overrides``, as ``primus-ext <overrides>`` sees it."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    if GlobalHydra.instance().is_initialized():
        GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def compose(overrides: list[str] | tuple[str, ...] = ()) -> RunSpec:
    """Compose ``overrides`` (Hydra syntax) and validate them into a RunSpec."""
    return spec_from_cfg(compose_cfg(overrides))


def _build(cls, group: str, values: Mapping[str, Any]):
    names = {f.name for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(values) - names)
    if unknown:
        raise ValueError(f"{group}.{unknown[0]} is not a {cls.__name__} field; known "
                         f"fields: {', '.join(sorted(names))}")
    kwargs = {k: (tuple(v) if isinstance(v, list) else v) for k, v in values.items()}
    missing = [f.name for f in dataclasses.fields(cls)
               if f.init and f.default is dataclasses.MISSING
               and f.default_factory is dataclasses.MISSING and kwargs.get(f.name) is None]
    if missing:
        raise ValueError(f"{group}: missing required field(s) {', '.join(missing)}")
    try:
        return cls(**kwargs)
    except ValueError as exc:
        # The spec names its own owner (hardware.x); say where the user typed it.
        owner = _OWNERS.get(cls)
        msg = str(exc)
        if owner and group != owner and msg.startswith(owner + "."):
            msg = group + msg[len(owner):]
        raise ValueError(msg) from None


def _plain(node) -> dict:
    return OmegaConf.to_container(node, resolve=True) if node is not None else {}


def model_from_cfg(cfg: DictConfig) -> ModelSpec:
    return model_and_notes(cfg)[0]


def model_and_notes(cfg: DictConfig) -> tuple[ModelSpec, list[str]]:
    """The ModelSpec of a composed config, and what a Hugging Face config.json read by
    ``model=hf model.hf_config=PATH`` holds that the projection does not model."""
    values = _plain(cfg.model)
    notes: list[str] = []
    if "hf_config" in values:
        from primus_ext.presets.hf_config import model_from_hf
        if values["hf_config"] in (None, "???"):
            raise ValueError("model=hf needs model.hf_config=PATH (a config.json or a "
                             "directory holding one)")
        fields, notes = model_from_hf(str(values.pop("hf_config")))
        # Fields stated on the command line (+model.FIELD=VALUE) override the file.
        values = {**fields, **{k: v for k, v in values.items() if v is not None}}
        notes = [f"model.hf_config: {n}" for n in notes]
    values = {k: v for k, v in values.items() if not (v is None and k in _REQUIRED_MODEL)}
    return _build(ModelSpec, "model", values), notes


def spec_from_cfg(cfg: DictConfig) -> RunSpec:
    """Validate the spec part of a composed config (model, parallel, train, cluster)."""
    return spec_and_notes(cfg)[0]


def spec_and_notes(cfg: DictConfig) -> tuple[RunSpec, list[str]]:
    """The RunSpec of a composed config, and a note for every setting the config left
    unstated (``null``) and the current performance recipes filled
    (``presets/recipe_defaults.py``)."""
    cluster = dict(_plain(cfg.cluster))
    hw_name = cluster.pop("hardware", None)
    if not isinstance(hw_name, str):
        raise ValueError(f"cluster.hardware={hw_name!r} must name a hardware preset: "
                         f"{', '.join(list_presets('hardware'))}")
    hw = hardware_preset(hw_name)
    hw_overrides = cluster.pop("hardware_overrides", None) or {}
    if hw_overrides:
        hw = _build(type(hw), "cluster.hardware_overrides",
                    {**{f.name: getattr(hw, f.name) for f in dataclasses.fields(hw)},
                     **hw_overrides})
    te = cfg.train.get("te")
    parallel, notes = fill_unstated_parallel(
        _plain(cfg.parallel), te=hw.name != "cpu" if te is None else bool(te))
    model, model_notes = model_and_notes(cfg)
    notes = model_notes + notes
    parts = {"model": model,
             "parallel": _build(ParallelSpec, "parallel", parallel),
             "train": _build(TrainSpec, "train", _plain(cfg.train)),
             "cluster": _build(ClusterSpec, "cluster", {**cluster, "hardware": hw})}
    spec = RunSpec(**parts, framework=str(cfg.get("framework", "megatron")))
    if spec.layout.how == "balanced":
        # Megatron-LM refuses layers that do not divide pp*vpp unless the split is
        # written out (arguments.py:570); the recipe writes it, the projection says so.
        notes = notes + [f"{spec.layout.describe()}: the layers do not divide pp*vpp, so "
                         "the split is chosen here; a recipe writes it as "
                         "--pipeline-model-parallel-layout (Megatron-LM refuses the "
                         "line without it)"]
    return spec, notes


def layout_note(cfg: DictConfig) -> str | None:
    """The note saying where the layout comes from: the recipe's (layout/<model>.yaml)
    while its values stand, else one naming the overrides that replaced them."""
    note, recipe = cfg.get("layout_note"), cfg.get("recipe_layout")
    if not note or not recipe:
        return note or None
    changed = [f"parallel.{k}={cfg.parallel.get(k)}" for k, v in recipe.items()
               if cfg.parallel.get(k) != v]
    if not changed:
        return note
    wanted = " ".join(f"{k.upper()}{v}" for k, v in recipe.items())
    return (f"layout set by {', '.join(changed)}; the recipe layout for this model is "
            f"{wanted} (layout/{cfg.model.get('name', 'model')}.yaml)")


_OWNERS = {HardwareSpec: "hardware"}
_REQUIRED_MODEL = frozenset(f.name for f in dataclasses.fields(ModelSpec)
                            if f.default is dataclasses.MISSING)


def tune_spec(cfg: DictConfig) -> tuple[RunSpec, tuple[str, ...]]:
    """The tuner's job: the composed spec, or, when its layout cannot run the job, the
    smallest legal model-parallel layout (tune/start.py); and the parallel settings the
    config left unstated (each candidate takes the recipe rule's value)."""
    from primus_ext.presets.recipe_defaults import UNSTATED_PARALLEL
    from primus_ext.tune.start import starting_spec

    unstated = tuple(k for k in UNSTATED_PARALLEL if cfg.parallel.get(k) is None)
    try:
        return spec_from_cfg(cfg), unstated
    except ValueError as exc:
        first = exc
    cl = _plain(cfg.cluster)
    hw = hardware_preset(cl["hardware"]) if isinstance(cl.get("hardware"), str) else None
    node = int(cl.get("gpus_per_node") or (hw.gpus_per_node if hw else 8))
    world = int(cl.get("num_nodes") or 1) * node

    def build(fields: dict) -> RunSpec:
        c = copy.deepcopy(cfg)
        for k, v in fields.items():
            OmegaConf.update(c, f"parallel.{k}", v, merge=False)
        return spec_from_cfg(c)
    return starting_spec(build, world=world, node_size=node,
                         num_layers=int(cfg.model.num_layers),
                         global_batch_size=int(cfg.train.global_batch_size),
                         error=first), unstated


def tune_inputs(overrides: list[str]) -> tuple[RunSpec, dict, dict]:
    """What the tuner needs from override strings: the spec, the composed ``tune`` group
    as a plain dict (unresolved: ``${hydra:...}`` needs a Hydra run), and the calibration
    and profile settings."""
    cfg = compose_cfg(list(overrides))
    data = OmegaConf.to_container(cfg.tune, resolve=False)
    extra = {"calibration": cfg.get("calibration", "default"), "profile": cfg.get("profile")}
    spec, unstated = tune_spec(cfg)
    return spec, data, {**extra, "unstated": unstated}
