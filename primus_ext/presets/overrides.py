"""RunSpec <-> Hydra override strings, without Hydra (pure).

``spec_overrides(spec)`` writes every field of the model, parallel and train groups and
the cluster, so composing them on any model preset gives the same spec back;
``apply_overrides(spec, overrides)`` applies ``group.key=value`` strings to a spec the way
``compose`` would (values parsed as YAML), so a profile's downscaled run can be rebuilt
from its target and its overrides alone.
"""
from __future__ import annotations

import dataclasses

import yaml

from primus_ext.presets import hardware_preset
from primus_ext.spec import ClusterSpec, RunSpec
from primus_ext.util.values import hydra_value

GROUPS = ("model", "parallel", "train")


def spec_overrides(spec: RunSpec) -> list[str]:
    """Every field of ``spec`` as an override (``cluster.hardware`` by preset name, with
    ``+cluster.hardware_overrides.*`` for fields that differ from the preset)."""
    out = [] if spec.framework == "megatron" else [f"framework={spec.framework}"]
    for group in GROUPS:
        value = getattr(spec, group)
        for f in dataclasses.fields(value):
            if f.init:
                out.append(f"{group}.{f.name}={hydra_value(getattr(value, f.name))}")
    c = spec.cluster
    out += [f"cluster.hardware={c.hardware.name}", f"cluster.num_nodes={c.num_nodes}",
            f"cluster.gpus_per_node={hydra_value(c.gpus_per_node)}"]
    out += [f"+cluster.hardware_overrides.{k}={hydra_value(v)}"
            for k, v in hardware_diff(c.hardware).items()]
    return out


def hardware_diff(hw) -> dict:
    """Fields of ``hw`` that differ from its preset (empty for an unknown preset)."""
    try:
        base = hardware_preset(hw.name)
    except ValueError:
        return {}
    return {f.name: getattr(hw, f.name) for f in dataclasses.fields(hw)
            if getattr(hw, f.name) != getattr(base, f.name)}


def _parse(item: str) -> tuple[str, object]:
    key, sep, raw = item.partition("=")
    if not sep:
        raise ValueError(f"override {item!r} must look like group.key=value")
    value = yaml.safe_load(raw) if raw.strip() else None
    return key.lstrip("+~"), value


_CLUSTER_KEYS = ("hardware", "num_nodes", "gpus_per_node", "gpu_hour_cost")


def _split(overrides) -> tuple[dict[str, dict], dict, dict]:
    """``group.key=value`` overrides sorted into per-group fields, cluster fields and
    hardware-constant overrides."""
    parts: dict[str, dict] = {g: {} for g in GROUPS}
    cluster: dict = {}
    hw_over: dict = {}
    for item in overrides:
        key, value = _parse(item)
        if key == "framework":  # a spec field of its own (RunSpec.framework)
            parts.setdefault("", {})["framework"] = value
            continue
        group, _, name = key.partition(".")
        if isinstance(value, list):
            value = tuple(value)
        if group in parts and name and "." not in name:
            parts[group][name] = value
        elif group == "cluster" and name.startswith("hardware_overrides."):
            hw_over[name.split(".", 1)[1]] = value
        elif group == "cluster" and name in _CLUSTER_KEYS:
            cluster[name] = value
        else:
            raise ValueError(f"override {item!r}: only model.*, parallel.*, train.* and "
                             "cluster.* keys can be applied to a spec")
    return parts, cluster, hw_over


def apply_overrides(spec: RunSpec, overrides: list[str] | tuple[str, ...]) -> RunSpec:
    """``spec`` with ``group.key=value`` overrides applied (validated as a new RunSpec)."""
    parts, cluster, hw_over = _split(overrides)
    framework = parts.pop("", {}).get("framework", spec.framework)
    new = {g: dataclasses.replace(getattr(spec, g), **parts[g]) if parts[g]
           else getattr(spec, g) for g in GROUPS}
    hw = spec.cluster.hardware
    if "hardware" in cluster:
        hw = hardware_preset(cluster.pop("hardware"))
    if hw_over:
        hw = dataclasses.replace(hw, **hw_over)
    new_cluster = dataclasses.replace(spec.cluster, hardware=hw, **cluster)
    return RunSpec(model=new["model"], parallel=new["parallel"], train=new["train"],
                   cluster=new_cluster, framework=framework)


def spec_from_overrides(overrides: list[str] | tuple[str, ...]) -> RunSpec:
    """A RunSpec from a complete override list (as ``spec_overrides`` writes it)."""
    from primus_ext.spec import ModelSpec, ParallelSpec, TrainSpec
    parts, cluster, hw_over = _split(overrides)
    framework = parts.pop("", {}).get("framework", "megatron")
    hw = hardware_preset(cluster.pop("hardware"))
    if hw_over:
        hw = dataclasses.replace(hw, **hw_over)
    return RunSpec(model=ModelSpec(**parts["model"]), parallel=ParallelSpec(**parts["parallel"]),
                   train=TrainSpec(**parts["train"]),
                   cluster=ClusterSpec(hardware=hw, **cluster), framework=framework)


def cluster_of(hw_name: str, num_nodes: int, gpus_per_node: int) -> ClusterSpec:
    return ClusterSpec(hardware=hardware_preset(hw_name), num_nodes=num_nodes,
                       gpus_per_node=gpus_per_node)


def spec_config(spec: RunSpec) -> dict:
    """``spec`` as the nested configuration Hydra composes: ``{"model": {...},
    "parallel": {...}, "train": {...}, "cluster": {"hardware": <preset>, ...}}`` with JSON
    values (tuples as lists), the same fields ``spec_overrides`` writes."""
    def plain(v):
        return list(v) if isinstance(v, tuple) else v
    out = {group: {f.name: plain(getattr(getattr(spec, group), f.name))
                   for f in dataclasses.fields(getattr(spec, group)) if f.init}
           for group in GROUPS}
    c = spec.cluster
    out["cluster"] = {"hardware": c.hardware.name, "num_nodes": c.num_nodes,
                      "gpus_per_node": c.gpus_per_node, "gpu_hour_cost": c.gpu_hour_cost,
                      "hardware_overrides": hardware_diff(c.hardware)}
    return out
