"""The layout tuner: search space, memory pre-filter, seed planner, search strategies,
LLM investigation loop, trial journal (see run.py for the whole path).

``primus_ext.tune(...)`` is the public entry point. Importing this package replaces the
top-level lazy function of that name with the package itself (Python binds a subpackage
as an attribute of its parent), so the package is made callable with the same signature.
"""
from __future__ import annotations

import sys
import types


class _CallableModule(types.ModuleType):
    def __call__(self, *args, **kwargs):
        from primus_ext.tune.run import tune as _tune
        return _tune(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
