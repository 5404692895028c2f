"""The cheapest activation-memory saving that makes a run fit (pure).

A run that does not fit as stated gets, in order of compute cost, the first of:

1. selective recompute (megatron-core ``--recompute-granularity selective``), the
   lightest ``--recompute-modules`` set that fits, lightest first as megatron-core's
   ``TransformerConfig.recompute_modules`` documents them: ``moe_act`` (the experts'
   activation, elementwise), ``core_attn`` (the attention kernel), both, then the MLP
   (``mlp`` / ``moe``: its GEMMs) with core attention;
2. full recompute of the fewest layers: ``recompute_method=block`` with the smallest
   ``recompute_num_layers`` k that fits (megatron-core ``TransformerBlock._checkpointed_
   forward``, method ``block``: the first k layers of every model chunk are recomputed
   whole, the others keep their activations), found by bisection since the peak falls
   as k grows;
3. full recompute of every layer (``uniform``, one layer per checkpoint).

Each step is tried only when it saves more than the run already does (a run stated with
selective recompute tries only module sets that contain its own). ``cheapest_fit`` returns the chosen spec and a
one-line note; a run that fits as stated is returned unchanged with an empty note.
The published-run reader and the tuner both use it, so a row and a candidate that do not
fit are relieved the same way.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

from primus_ext.memory.options import MemoryOptions
from primus_ext.memory.report import MemoryReport, memory_report
from primus_ext.spec.run import RunSpec

GIB = 1 << 30


@dataclass(frozen=True, kw_only=True, slots=True)
class FitChoice:
    spec: RunSpec  # the run as stated, or its cheapest fitting variant
    step: str  # as_stated | selective | block | full | none
    fits: bool
    note: str  # one line; empty when the run fits as stated
    peak_bytes: int


def _with(spec: RunSpec, **train) -> RunSpec:
    # megatron-core refuses whole-layer CPU offloading together with recompute: a
    # recompute rung replaces it.
    train.setdefault("cpu_offloading_num_layers", 0)
    return dataclasses.replace(spec, train=dataclasses.replace(spec.train, **train))


def _max_chunk_layers(spec: RunSpec) -> int:
    par = spec.parallel
    return max(spec.layout.num_layers(s, c) for s in range(par.pp) for c in range(par.vpp))


def _label(spec: RunSpec) -> str:
    t = spec.train
    if t.recompute_granularity == "full":
        return (f"recompute_granularity=full, recompute_method={t.recompute_method}, "
                f"recompute_num_layers={t.recompute_num_layers}")
    return f"recompute_granularity={t.recompute_granularity}"


def cheapest_fit(spec: RunSpec, options: MemoryOptions | None = None,
                 memory_fn: Callable[[RunSpec], MemoryReport] | None = None,
                 module_sets: list[tuple[str, ...]] | None = None) -> FitChoice:
    """The first rung of the ladder (module docstring) on which ``spec`` fits.
    ``module_sets`` replaces the selective rungs (a caller that can only express some)."""
    mem = memory_fn or (lambda s: memory_report(s, options))
    stated = mem(spec)
    if stated.fits:
        return FitChoice(spec=spec, step="as_stated", fits=True, note="",
                         peak_bytes=stated.peak_bytes)
    head = (f"does not fit as stated (peak {stated.peak_bytes / GIB:.1f} GiB of "
            f"{stated.device_bytes / GIB:.0f} GiB)")
    t = spec.train
    if t.recompute_granularity == "full" and t.recompute_method == "uniform" \
            and t.recompute_num_layers == 1:
        return FitChoice(spec=spec, step="none", fits=False, peak_bytes=stated.peak_bytes,
                         note=f"{head}; already full recompute: no recompute saves more")
    if t.recompute_granularity in (None, "selective"):
        have = set(t.recompute_modules) if t.recompute_granularity else set()
        for mods in (selective_rungs(spec) if module_sets is None else module_sets):
            if t.recompute_granularity and (not have < set(mods)):
                continue
            cand = _with(spec, recompute_granularity="selective", recompute_modules=mods)
            rep = mem(cand)
            if rep.fits:
                return _chosen("selective", cand, rep, head)
    block = _fewest_block_layers(spec, mem)
    if block is not None:
        return _chosen("block", block[0], block[1], head)
    full = _with(spec, recompute_granularity="full", recompute_method="uniform",
                 recompute_num_layers=1)
    rep = mem(full)
    if rep.fits:
        return _chosen("full", full, rep, head)
    return FitChoice(spec=spec, step="none", fits=False, peak_bytes=stated.peak_bytes,
                     note=f"{head}; no recompute makes it fit (full recompute: peak "
                          f"{rep.peak_bytes / GIB:.1f} GiB)")


def selective_rungs(spec: RunSpec) -> list[tuple[str, ...]]:
    """Selective module sets, lightest recompute first (module docstring)."""
    m = spec.model
    moe = m.is_moe
    dense = any(not m.is_moe_layer(i) for i in range(m.num_layers))
    rungs: list[tuple[str, ...]] = []
    if moe:
        rungs.append(("moe_act",))
    rungs.append(("core_attn",))
    if moe:
        rungs.append(("core_attn", "moe_act"))
    heavy = (("mlp",) if dense else ()) + (("moe",) if moe else ())
    rungs.append(("core_attn",) + heavy)
    return rungs


def _fewest_block_layers(spec: RunSpec, mem) -> tuple[RunSpec, MemoryReport] | None:
    """The smallest k of ``block`` recompute that fits (bisection), or None."""
    t = spec.train
    current = t.recompute_num_layers if t.recompute_method == "block" else 0
    hi = _max_chunk_layers(spec)

    def cand(k: int) -> RunSpec:
        return _with(spec, recompute_granularity="full", recompute_method="block",
                     recompute_num_layers=k)

    lo = current + 1
    if lo > hi or not mem(cand(hi)).fits:
        return None
    while lo < hi:  # lower-bound bisection: the peak falls as k grows
        mid = (lo + hi) // 2
        if mem(cand(mid)).fits:
            hi = mid
        else:
            lo = mid + 1
    return cand(hi), mem(cand(hi))


def _chosen(step: str, spec: RunSpec, rep: MemoryReport, head: str) -> FitChoice:
    extra = ""
    if step == "selective":
        extra = f", recompute_modules={','.join(spec.train.recompute_modules)}"
    if step == "block":
        extra = (f" (the first {spec.train.recompute_num_layers} of up to "
                 f"{_max_chunk_layers(spec)} layers per model chunk recomputed)")
    return FitChoice(spec=spec, step=step, fits=True, peak_bytes=rep.peak_bytes,
                     note=f"{head}; cheapest saving that fits: {_label(spec)}{extra}, "
                          f"peak {rep.peak_bytes / GIB:.1f} GiB")
