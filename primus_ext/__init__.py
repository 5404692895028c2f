"""primus-ext: project the step time, throughput, MFU and memory of megatron-core training
runs at their target scale, and tune their parallel layout.

The public Python API (stable):

- ``compose(overrides) -> RunSpec``: the CLI's composition and validation, from Hydra
  override strings;
- ``project(spec) -> Estimate``; ``memory(spec) -> MemoryReport``; ``tune(...)``.
"""
from __future__ import annotations

__version__ = "0.1.0"


def compose(overrides=()):
    if isinstance(overrides, (str, bytes)) or not all(isinstance(o, str) for o in overrides):
        raise TypeError(f"compose(overrides={overrides!r}): overrides must be a list of "
                        "Hydra override strings, e.g. compose(['model=llama3_70b', "
                        "'parallel.tp=4'])")
    from primus_ext.config import compose as _compose
    return _compose(list(overrides))


def _check_spec(fn: str, spec) -> None:
    from primus_ext.spec.run import require_spec
    require_spec(fn, spec)


def memory(spec):
    _check_spec("memory", spec)
    from primus_ext.memory.report import memory_report
    return memory_report(spec)


def project(spec, **kwargs):
    _check_spec("project", spec)
    from primus_ext.project.estimate import project as _project
    return _project(spec, **kwargs)


def tune(*args, **kwargs):
    from primus_ext.tune.run import tune as _tune
    return _tune(*args, **kwargs)


__all__ = ["compose", "memory", "project", "tune", "__version__"]
