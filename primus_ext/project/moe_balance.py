"""Expert-parallel load imbalance from measured routing (pure).

Every EP rank holds ``experts_per_rank`` consecutive experts and receives the tokens the
routers send them; the layer's combine all-to-all waits for the busiest rank, so the
expert compute of a step costs ``max / mean`` of the ranks' loads times the balanced
cost. From measured tokens-per-expert vectors (one per layer and microbatch):

- group each vector into ranks of ``experts_per_rank`` consecutive experts;
- when a vector holds exactly ``ep`` ranks' experts (the measurement kept all the
  target's experts), the busiest rank is counted: the mean over vectors of
  ``max / mean`` of the rank loads (exact, whether the imbalance is systematic -- the
  same experts favoured every time, as by an untrained router -- or random);
- otherwise take the coefficient of variation of the rank loads (sample standard
  deviation over the mean), root-mean-square over the vectors, and the expected busiest
  of ``ep`` ranks under a normal spread of loads, ``1 + cv * E[max of ep standard
  normals]`` (Blom's approximation of the normal order statistic; exact for 2 ranks:
  ``1 / sqrt(pi)``).

A measurement with fewer experts than the target groups them the same way (same experts
per rank); when it holds fewer than two ranks' worth, the spread of single experts is
scaled by ``1 / sqrt(experts_per_rank)`` (independent experts).
"""
from __future__ import annotations

import math

from primus_ext.compute.routing import expected_max_normal


def _cv(values: list[float]) -> float | None:
    n = len(values)
    mean = sum(values) / n if n else 0.0
    if n < 2 or mean <= 0:
        return None
    var = sum((v - mean) ** 2 for v in values) / (n - 1)
    return math.sqrt(var) / mean


def rank_load_cv(loads, experts_per_rank: int) -> float:
    """Spread of the per-rank loads (see the module docstring); 0 without data."""
    per = max(int(experts_per_rank), 1)
    cvs = []
    for vec in loads:
        vec = list(vec)
        if len(vec) >= 2 * per and len(vec) % per == 0:
            cv = _cv([sum(vec[i:i + per]) for i in range(0, len(vec), per)])
        else:
            cv = _cv([float(v) for v in vec])
            cv = cv / math.sqrt(per) if cv is not None else None
        if cv is not None:
            cvs.append(cv)
    return math.sqrt(sum(c * c for c in cvs) / len(cvs)) if cvs else 0.0


def busiest_rank_factor(loads, experts_per_rank: int, ep: int) -> float:
    """Expected busiest-rank load over the mean load, for ``ep`` ranks (1.0 for ep 1)."""
    if ep <= 1 or not loads:
        return 1.0
    per = max(int(experts_per_rank), 1)
    if all(len(v) == ep * per for v in loads):
        counted = []
        for vec in loads:
            ranks = [sum(vec[i:i + per]) for i in range(0, len(vec), per)]
            if sum(ranks) > 0:
                counted.append(max(ranks) * ep / sum(ranks))
        if counted:
            return sum(counted) / len(counted)
    return 1.0 + rank_load_cv(loads, per) * expected_max_normal(ep)
