"""The target's collectives recosted from a measured Profile (the hybrid backend): a call
the measured run issued inside its layers stands in for the target op of the same
collective, axis, group size and phase (timed in situ: rank skew, transport share of the
cores and the exposed part of an overlapped call come with it); otherwise the profile's
microbenchmark fit, where the op's group lies in the measured tier (same hardware, inside
one scale-up domain); otherwise the comm model's time stands.
"""
from __future__ import annotations

import dataclasses

from primus_ext.comm.groups import group_span
from primus_ext.compute.costs import CommOp
from primus_ext.project.profile import CommFit, Profile
from primus_ext.project.profile_hardware import same_hardware
from primus_ext.spec import RunSpec


def _in_measured_tier(profile: Profile, spec: RunSpec, op: CommOp) -> bool:
    """Same hardware, and the op's group inside one scale-up domain of the target."""
    if not same_hardware(profile, spec) or op.axis in ("pp",):
        return False
    axis = {"dp": "dp_cp"}.get(op.axis, op.axis)
    try:
        return group_span(spec, axis).intra_domain
    except ValueError:
        return False


def _fit_for(profile: Profile, spec: RunSpec, op: CommOp) -> CommFit | None:
    if not _in_measured_tier(profile, spec, op):
        return None
    for f in profile.comm_fits:
        if f.collective == op.collective and f.group_size == op.group_size:
            return f
    return None


# A traced call stands in for a target op of the same collective, axis, group size and
# phase whose bytes differ by at most this fraction (the comm model and the tracer count
# the same buffer; see profile.py).
IN_SITU_BYTES_TOL = 0.02


def _in_situ(profile: Profile, op: CommOp, kind: str | None = None
             ) -> tuple[float, float] | None:
    """(seconds, exposed seconds) of ``op`` as the measured run issued it inside its
    layers (in layer kind ``kind`` if it did there, else count-weighted over the kinds
    that issued it), or None if it never did. Timed in the run itself, between the
    layer's real compute on the local ranks, a call carries what a step pays there: the
    rank skew of the compute before it, the transport's share of the cores, and, for an
    async call overlapped with a GEMM, the part the overlap left exposed (its
    ``blocked_s``), none of which a microbenchmark fit holds (docs/cpu-proof.md)."""
    per_call = op.num_bytes / op.calls
    own = _in_situ_of([c for c in profile.collectives if c.kind == kind], op, per_call)
    return own if own is not None else _in_situ_of(profile.collectives, op, per_call)


def _in_situ_of(seen, op: CommOp, per_call: float) -> tuple[float, float] | None:
    num = held = den = 0.0
    for c in seen:
        if c.kind == "step" or c.seconds <= 0 or c.blocked_s is None or \
                c.collective != op.collective or c.group_size != op.group_size or \
                c.phase != op.phase or c.axis != op.axis or \
                abs(c.num_bytes - per_call) > IN_SITU_BYTES_TOL * per_call:
            continue
        # ``seconds`` is the median call, ``blocked_s`` the mean: a synchronous call is
        # blocked for all of its time, so the mean call lasts at least ``blocked_s``.
        num += c.count * max(c.seconds, c.blocked_s)
        held += c.count * c.blocked_s
        den += c.count
    return (op.calls * num / den, op.calls * held / den) if den > 0 else None


def _recost(profile: Profile, spec: RunSpec, ops: tuple[CommOp, ...],
            kind: str | None = None) -> tuple[tuple[CommOp, ...], int]:
    out, in_situ = [], 0
    for op in ops:
        if op.seconds <= 0 or not _in_measured_tier(profile, spec, op):
            out.append(op)
            continue
        # A CP ring sends cp-1 equal steps; otherwise the op's own calls.
        steps = op.group_size - 1 if op.collective == "p2p" else op.calls
        seen = _in_situ(profile, op, kind) if op.collective != "p2p" else None
        fit = _fit_for(profile, spec, op) if seen is None else None
        if seen is None and fit is None:
            out.append(op)
            continue
        if seen is not None:
            secs, exposed = seen
            in_situ += 1
        else:
            secs = steps * fit.seconds(op.num_bytes / steps)
            exposed = secs if op.exposed_s >= op.seconds else \
                op.exposed_s * secs / op.seconds
        out.append(dataclasses.replace(op, seconds=secs, exposed_s=min(exposed, secs)))
    return tuple(out), in_situ
