"""Preset lookup: the YAML files of ``hydra_conf/`` read without Hydra (pure core side).

The Hydra app composes the same files; this module serves code that must not import
Hydra (the published-run reader, the tuner's cluster planning, tests).
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import yaml

from primus_ext.spec.hardware import HardwareSpec

CONF_DIR = Path(__file__).resolve().parents[2] / "hydra_conf"


def _conf_dir() -> Path:
    if CONF_DIR.is_dir():
        return CONF_DIR
    import hydra_conf  # installed as a package next to primus_ext
    return Path(hydra_conf.__file__).resolve().parent


# Files of a group that are readers, not presets: model/hf.yaml reads a Hugging Face
# config.json (presets/hf_config.py).
_READERS = {"model": ("hf",)}


def list_presets(group: str) -> list[str]:
    return sorted(p.stem for p in (_conf_dir() / group).glob("*.yaml")
                  if not p.stem.startswith("_") and p.stem not in _READERS.get(group, ()))


@lru_cache(maxsize=None)
def _load(group: str, name: str) -> dict:
    path = _conf_dir() / group / f"{name}.yaml"
    if not path.is_file():
        raise ValueError(f"{group}={name!r} is not a preset; available: "
                         f"{', '.join(list_presets(group))}")
    with open(path) as f:
        data = yaml.safe_load(f) or {}
    data.pop("defaults", None)
    return data


def model_preset(name: str) -> dict:
    """The fields of a model preset (a fresh dict: callers may edit it)."""
    return dict(_load("model", name))


@lru_cache(maxsize=None)
def hardware_preset(name: str) -> HardwareSpec:
    return HardwareSpec(**_load("hardware", name))
