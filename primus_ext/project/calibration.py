"""Calibration files: fitted physical constants per hardware preset.

A calibration maps a hardware preset name to values of HardwareSpec efficiency fields
(fractions of peak, latencies, per-kernel overheads). Nothing in it is keyed to a model,
a source or a row. ``mode=calibrate`` writes one (to a path the user names, or under the
user's primus-ext home: ``default_output_path``); ``mode=project`` and ``mode=validate``
apply one with ``calibration=FILE`` (the committed fit on the public validation set is
the default).
"""
from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from primus_ext.spec import HardwareSpec, RunSpec
from primus_ext.util.files import atomic_write_text, input_file

SCHEMA_VERSION = 1
DEFAULT_PATH = Path(__file__).resolve().parent.parent / "data" / "calibration" / "default.json"


@dataclass(frozen=True, slots=True)
class Calibration:
    constants: dict  # hardware name -> {field: value}
    meta: dict

    def apply_hardware(self, hw: HardwareSpec) -> HardwareSpec:
        values = self.constants.get(hw.name)
        if not values:
            return hw
        return dataclasses.replace(hw, **values)

    def apply(self, spec: RunSpec) -> RunSpec:
        hw = self.apply_hardware(spec.cluster.hardware)
        if hw is spec.cluster.hardware:
            return spec
        return dataclasses.replace(spec, cluster=dataclasses.replace(spec.cluster, hardware=hw))

    def to_dict(self) -> dict:
        return {"schema_version": SCHEMA_VERSION, "meta": self.meta,
                "hardware": self.constants}


EMPTY = Calibration(constants={}, meta={"note": "presets' priors, nothing fitted"})


def _check(data, path: str) -> Calibration:
    if not isinstance(data, dict):
        raise ValueError(f"calibration={path}: not a calibration file (a JSON object with "
                         f"schema_version and hardware); it holds a JSON "
                         f"{type(data).__name__}. Write one with mode=calibrate out=FILE")
    if data.get("schema_version") != SCHEMA_VERSION:
        raise ValueError(f"calibration {path}: schema_version="
                         f"{data.get('schema_version')!r} must be {SCHEMA_VERSION}")
    fields = {f.name for f in dataclasses.fields(HardwareSpec)}
    hardware = data.get("hardware")
    if not isinstance(hardware, dict):
        raise ValueError(f"calibration {path}: 'hardware' must map preset names to constants")
    for name, values in hardware.items():
        if not isinstance(values, dict):
            raise ValueError(f"calibration {path}: hardware.{name} must map HardwareSpec "
                             "fields to values")
        for key in values:
            if key not in fields:
                raise ValueError(f"calibration {path}: hardware.{name}.{key} is not a "
                                 "HardwareSpec field")
    return Calibration(constants=hardware, meta=data.get("meta", {}))


@lru_cache(maxsize=8)
def _load(path: str, mtime: float) -> Calibration:
    with open(path) as f:
        try:
            data = json.load(f)
        except json.JSONDecodeError as exc:
            raise ValueError(f"calibration {path} is not valid JSON: {exc}") from exc
    return _check(data, path)


def load_calibration(path: str | os.PathLike | None) -> Calibration:
    """``None`` -> priors only; ``"default"`` -> the committed fit; else a file path."""
    if path is None or path == "none":
        return EMPTY
    if path == "default":
        if not DEFAULT_PATH.is_file():
            return EMPTY
        p = DEFAULT_PATH
    else:
        p = input_file(path, "calibration")
    return _load(str(p), p.stat().st_mtime)


def calibration_note(path, hardware: str) -> str:
    """One line saying which fitted constants a projection used for ``hardware``."""
    calib = load_calibration(path)
    where = ("none (calibration=null)" if path in (None, "none") else
             f"the packaged fit ({DEFAULT_PATH.name})" if path == "default" else str(path))
    values = calib.constants.get(hardware)
    if not values:
        return (f"calibration: {where}; no fitted constants for {hardware}, the preset's "
                "priors are used")
    return (f"calibration: {where}, {len(values)} fitted constant(s) for {hardware} "
            f"({', '.join(sorted(values))})")


def default_output_path() -> Path:
    """Where ``mode=calibrate`` writes without ``out=``: the user's primus-ext home
    (``$PRIMUS_EXT_HOME``, else ``~/.cache/primus-ext``), never the package."""
    home = os.environ.get("PRIMUS_EXT_HOME") or os.path.join(
        os.path.expanduser("~"), ".cache", "primus-ext")
    return Path(home) / "calibration.json"


def save_calibration(calib: Calibration, path: str | os.PathLike) -> None:
    """Write atomically: a crash leaves the old file intact."""
    atomic_write_text(path, json.dumps(calib.to_dict(), indent=2, sort_keys=True) + "\n")
