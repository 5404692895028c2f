"""Small pure helpers of the search space: axis value lists, a build-once memo and the
grouping key of legality errors."""
from __future__ import annotations

import re
from typing import Iterable


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _pow2_upto(n: int) -> list[int]:
    out, v = [], 1
    while v <= n:
        out.append(v)
        v *= 2
    return out


def _uniq(values: Iterable) -> tuple:
    seen: list = []
    for v in values:
        if v not in seen:
            seen.append(v)
    return tuple(seen)


def _memo(cache: dict, key, build):
    """``build()`` once per key; a ValueError is remembered and raised again."""
    hit = cache.get(key)
    if hit is None:
        try:
            hit = build()
        except ValueError as exc:
            hit = exc
        cache[key] = hit
    if isinstance(hit, ValueError):
        raise hit
    return hit


def _reason_key(msg: str) -> str:
    """Group legality errors by rule: the message with its numbers blanked."""
    key = re.sub(r"\d+", "N", msg)
    key = re.sub(r"N(\*N)+", "N", key)
    return key[:110]
