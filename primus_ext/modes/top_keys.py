"""The top-level keys of the config tree (not the model/parallel/train/cluster/tune
groups): which mode reads which, and their types, checked once before a mode runs.

A key set to something other than its default in a mode that never reads it is an
error naming the key and the mode (``mode=measure out=x`` would otherwise be ignored:
measure writes ``profile=``), so an override is never silently dropped.
"""
from __future__ import annotations

# key -> its default in hydra_conf/config.yaml
DEFAULTS = {"backend": "simulate", "profile": None, "calibration": "default",
            "runs": "default", "out": None, "loso": True, "golden": "default",
            "plot": None, "trace": None, "trace_max_events": 100000}

READS = {
    "project": {"backend", "profile", "calibration", "plot", "trace", "trace_max_events"},
    "memory": {"plot"},
    "describe": set(),
    "validate": {"calibration", "runs", "out"},
    "calibrate": {"runs", "out", "loso", "golden"},
    "tune": {"calibration", "profile"},
    "measure": {"profile"},
}

# Where a key a mode does not read has an equivalent it does read.
_INSTEAD = {("measure", "out"): "mode=measure writes its profile to profile=FILE",
            ("tune", "out"): "the tuner writes into tune.out_dir=DIR",
            ("memory", "calibration"): "memory does not depend on the fitted constants",
            ("describe", "calibration"): "describe does not depend on the fitted constants"}

# Values of calibration= with a meaning of their own: an out= of that name would be
# written as a file but never read back by calibration=NAME.
_RESERVED_CALIBRATION = ("default", "none", "null")


def check_top_keys(cfg, mode: str) -> None:
    """Raise one ValueError for an unread override or a badly typed top-level key."""
    reads = READS.get(mode, set(DEFAULTS))
    for key, default in DEFAULTS.items():
        value = cfg.get(key, default)
        if key not in reads and value != default:
            why = _INSTEAD.get((mode, key), "")
            raise ValueError(f"{key}={value!r} is not read by mode={mode}"
                             + (f" ({why})" if why else "")
                             + f"; modes that read {key}=: "
                             + ", ".join(m for m, r in READS.items() if key in r))
    loso = cfg.get("loso", True)
    if not isinstance(loso, bool):
        raise ValueError(f"loso={loso!r} must be true or false")
    cap = cfg.get("trace_max_events", DEFAULTS["trace_max_events"])
    if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 1):
        raise ValueError(f"trace_max_events={cap!r} must be a positive integer or null "
                         "(draw every op)")
    out = cfg.get("out")
    if mode == "calibrate" and isinstance(out, str) and out.lower() in _RESERVED_CALIBRATION:
        raise ValueError(f"out={out!r} would not be read back: calibration={out} means "
                         f"{'the packaged fit' if out.lower() == 'default' else 'no fit'}; "
                         "give a file path such as out=./calibration.json")
