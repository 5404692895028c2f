"""Small validation helpers shared by the spec dataclasses.

Every user error is one ValueError that names the field, its value and the rule.

``check_types(obj, owner)`` checks every field against its annotation first, so that a
string where a boolean belongs (``parallel.fsdp=off`` from the command line, or through
``dataclasses.replace`` in Python) is an error rather than a truthy value. Integers are
accepted for float fields; booleans are never numbers; non-finite floats are refused
(no spec quantity is nan or infinite); lists are accepted for tuples (Hydra gives lists;
``__post_init__`` converts them). Names (``str`` fields called ``name``) must be one line
of printable text: they end up in reports, comments of launch scripts and file names.
"""
from __future__ import annotations

import math
import types
import typing

_CHECKS: dict[type, tuple] = {}
_PLURAL = {int: "integers", float: "numbers", str: "strings", bool: "booleans"}


def positive(owner: str, name: str, value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{owner}.{name}={value!r} must be a positive integer")


def non_negative(owner: str, name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ValueError(f"{owner}.{name}={value!r} must be a non-negative number")


def one_of(owner: str, name: str, value, allowed) -> None:
    if value not in allowed:
        choices = ", ".join(repr(a) for a in allowed)
        raise ValueError(f"{owner}.{name}={value!r} must be one of {choices}")


def divides(owner: str, num_name: str, num: int, den_name: str, den: int) -> None:
    if den <= 0 or num % den != 0:
        raise ValueError(f"{owner}: {num_name}={num} is not divisible by {den_name}={den}")


# ---- field types ----------------------------------------------------------------------
def _describe(tp) -> str:
    if tp is type(None):
        return "null"
    if tp is bool:
        return "a boolean (true or false)"
    if tp is int:
        return "an integer"
    if tp is float:
        return "a number"
    if tp is str:
        return "a string"
    origin = typing.get_origin(tp)
    if origin is tuple:
        item = typing.get_args(tp)[0]
        return "a list of " + _PLURAL.get(item, getattr(item, "__name__", str(item)))
    return f"a {getattr(tp, '__name__', str(tp))}"


def _matches(tp, value) -> bool:
    if tp is typing.Any:
        return True
    if tp is type(None):
        return value is None
    if tp is bool:
        return isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is float:
        return (isinstance(value, (int, float)) and not isinstance(value, bool)
                and math.isfinite(value))
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return any(_matches(a, value) for a in typing.get_args(tp))
    if origin is tuple:
        item = typing.get_args(tp)[0]
        return isinstance(value, (tuple, list)) and all(_matches(item, v) for v in value)
    if origin is not None:  # Mapping[...] and the like: the container kind only
        return isinstance(value, origin)
    return isinstance(value, tp)


def _field_checks(cls) -> tuple:
    checks = _CHECKS.get(cls)
    if checks is None:
        import dataclasses
        hints = typing.get_type_hints(cls)
        checks = tuple((f.name, hints[f.name]) for f in dataclasses.fields(cls) if f.init)
        _CHECKS[cls] = checks
    return checks


def check_types(obj, owner: str) -> None:
    """Raise one ValueError for the first field whose value does not fit its type."""
    for name, tp in _field_checks(type(obj)):
        value = getattr(obj, name)
        if not _matches(tp, value):
            options = [a for a in (typing.get_args(tp) if typing.get_origin(tp) in (
                typing.Union, types.UnionType) else (tp,))]
            want = " or ".join(_describe(a) for a in options)
            raise ValueError(f"{owner}.{name}={value!r} must be {want}")
        # Every text field ends up on one line somewhere (overrides.txt, a recipe
        # comment, a CSV cell): a newline would split it.
        if isinstance(value, str) and not value.isprintable():
            raise ValueError(f"{owner}.{name}={value!r} must be one line of printable text "
                             "(no newline or control characters)")
