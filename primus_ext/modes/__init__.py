"""One module per ``mode=`` of the primus-ext app; each exposes ``run(cfg) -> dict``.

A mode whose feature has not landed yet says so plainly and exits non-zero.
"""
from __future__ import annotations

import importlib

MODES = ("project", "memory", "describe", "validate", "calibrate", "tune", "measure",
         "train")
OUTPUTS = ("table", "json")


class NotAvailable(RuntimeError):
    """A mode (or backend) that this version does not provide yet."""


def dispatch(cfg):
    mode = cfg.mode
    if mode not in MODES:
        raise ValueError(f"mode={mode!r} must be one of {', '.join(MODES)}")
    if cfg.get("output", "table") not in OUTPUTS:
        raise ValueError(f"output={cfg.output!r} must be one of {', '.join(OUTPUTS)}")
    from primus_ext.modes.top_keys import check_top_keys
    check_top_keys(cfg, mode)
    try:
        module = importlib.import_module(f"primus_ext.modes.{mode}")
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.startswith("primus_ext"):
            raise NotAvailable(f"mode={mode} is not available in this version yet") from exc
        raise
    return module.run(cfg)
