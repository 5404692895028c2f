"""Step-time projection: pipeline schedule simulation and the estimate built on it.

``primus_ext.project(spec, ...)`` is the public API. Python binds this subpackage as the
attribute ``project`` of ``primus_ext`` once it is imported, so the package itself is
callable and forwards to ``estimate.project``.
"""
from __future__ import annotations

import sys
import types


class _CallableModule(types.ModuleType):
    def __call__(self, spec, **kwargs):
        from primus_ext.project.estimate import project as _project
        from primus_ext.spec.run import require_spec
        require_spec("project", spec)
        return _project(spec, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
