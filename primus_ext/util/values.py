"""Value formatting shared by the writers: Hydra override syntax and JSON-safe data."""
from __future__ import annotations

import math
import re

_SAFE = re.compile(r"^[A-Za-z0-9_./:-]+$")
_BACKSLASHES = re.compile(r"(\\*)('|$)")
_INTERPOLATION = re.compile(r"(\\*)\$\{")


def hydra_value(v) -> str:
    """A value in Hydra's override grammar."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(hydra_value(x) for x in v) + "]"
    s = str(v)
    if _SAFE.match(s) and s not in ("null", "true", "false") and not _numeric(s):
        return s
    # Hydra's quoted strings: backslashes are literal except in a run that ends at a
    # quote (or at the closing quote), where they pair up; OmegaConf would resolve a
    # "${...}" even inside quotes, so "${" is escaped as "\${" (a backslash run before it
    # doubled, as OmegaConf pairs those up too).
    s = _INTERPOLATION.sub(lambda m: m.group(1) * 2 + "\\${", s)
    s = _BACKSLASHES.sub(lambda m: m.group(1) * 2 + ("\\'" if m.group(2) else ""), s)
    return "'" + s + "'"


def _numeric(s: str) -> bool:
    try:
        float(s)
        return True
    except ValueError:
        return False


def json_safe(obj, default=None):
    """``obj`` with non-finite floats as None and tuples as lists (strict JSON); other
    leaves that are not JSON scalars go through ``default`` when given (e.g. ``str``)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {str(k): json_safe(v, default) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v, default) for v in obj]
    if default is None or obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    return default(obj)
