"""Hydra overrides that reproduce a RunSpec, and its full composed config.

``spec_overrides(spec, user_overrides)``: the user's own overrides (those that shape the
job: model, cluster, train, calibration), then one ``group.field=value`` for every field
where the spec differs from what they compose to. The result is checked: composing it
gives ``spec`` again, or an AssertionError says which field went astray.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Sequence

from omegaconf import OmegaConf

from primus_ext.config import compose_cfg, spec_from_cfg, tune_spec
from primus_ext.spec import RunSpec
from primus_ext.util.values import hydra_value  # noqa: F401 (re-exported)

# Top-level keys and groups of a tune command that have no place in a projection command.
_DROP = re.compile(r"^[+~]*(mode|output|tune|hydra|plot|trace|out|runs)(\.|=|$)")
_GROUPS = ("model", "parallel", "train", "cluster")


def keep_override(o: str) -> bool:
    return not _DROP.match(o.strip())


def _key_of(o: str) -> str:
    return o.split("=", 1)[0].lstrip("+~")


def _starting_overrides(spec: RunSpec, user: Sequence[str] | None) -> list[str]:
    if user is not None:
        return [o for o in user if keep_override(o)]
    from primus_ext.presets import list_presets

    out = [] if spec.framework == "megatron" else [f"framework={spec.framework}"]
    if spec.model.name in list_presets("model"):
        out.append(f"model={spec.model.name}")
    out.append(f"cluster.hardware={spec.cluster.hardware.name}")
    return out


def _diffs(group: str, have, want, cfg) -> list[tuple[str, object]]:
    out = []
    for f in dataclasses.fields(want):
        if not f.init:
            continue
        a, b = getattr(have, f.name), getattr(want, f.name)
        if a != b:
            out.append((f.name, b))
    return out


def _group_overrides(have: RunSpec, spec: RunSpec, cfg) -> list[str]:
    extra: list[str] = []
    for group in ("model", "parallel", "train"):
        for name, value in _diffs(group, getattr(have, group), getattr(spec, group), cfg):
            prefix = "" if name in cfg[group] else "+"
            extra.append(f"{prefix}{group}.{name}={hydra_value(value)}")
    hc, wc = have.cluster, spec.cluster
    if hc.hardware.name != wc.hardware.name:
        extra.append(f"cluster.hardware={wc.hardware.name}")
    for name in ("gpu_hour_cost", "gpus_per_node", "num_nodes"):
        if getattr(hc, name) != getattr(wc, name):
            extra.append(f"cluster.{name}={hydra_value(getattr(wc, name))}")
    return extra


def _merge(out: list[str], extra: list[str]) -> list[str]:
    keys = {_key_of(e) for e in extra}
    return [o for o in out if _key_of(o) not in keys] + extra


def spec_overrides(spec: RunSpec, user_overrides: Sequence[str] | None = None) -> list[str]:
    """Overrides that compose to exactly ``spec``.

    Some defaults follow other keys (sequence parallelism follows tp), so the diff is
    taken again after composing until nothing differs."""
    out = _starting_overrides(spec, user_overrides)
    cfg = compose_cfg(out)
    try:
        have = spec_from_cfg(cfg)
    except ValueError:
        # The user's layout does not run the job (a global batch below the GPU count):
        # start from the tuner's starting layout, stated.
        from primus_ext.tune.splits import SPLIT_FIELDS
        start = tune_spec(cfg)[0].parallel
        out = _merge(out, [f"parallel.{k}={hydra_value(getattr(start, k))}"
                           for k in ("tp", "pp", "vpp", "cp") + SPLIT_FIELDS])
        cfg = compose_cfg(out)
        have = spec_from_cfg(cfg)
    first_hw = have.cluster.hardware.name
    for _ in range(3):
        extra = _group_overrides(have, spec, cfg)
        if not extra:
            break
        out = _merge(out, extra)
        cfg = compose_cfg(out)
        have = spec_from_cfg(cfg)
    if first_hw != spec.cluster.hardware.name:
        # Overrides of another GPU kind's constants do not carry over to this one.
        out = [o for o in out if not _key_of(o).startswith("cluster.hardware_overrides")]
        have = spec_from_cfg(compose_cfg(out))
    if have != spec:
        bad = [g for g in _GROUPS if getattr(have, g) != getattr(spec, g)]
        raise AssertionError(f"overrides {out} do not reproduce the spec (group(s) "
                             f"{', '.join(bad)} differ)")
    return out


def recipe_config(overrides: Sequence[str]) -> str:
    """The full composed config for ``overrides`` as YAML (mode=project, no tune group)."""
    cfg = compose_cfg(list(overrides) + ["mode=project"])
    data = OmegaConf.to_container(cfg, resolve=False)
    data.pop("tune", None)
    return OmegaConf.to_yaml(OmegaConf.create(data))
