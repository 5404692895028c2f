"""Small validation helpers shared by the spec dataclasses.

Every user error is one ValueError that names the field, its value and the rule.
"""
from __future__ import annotations


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
