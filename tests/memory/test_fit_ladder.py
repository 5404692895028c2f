"""memory/fit_ladder.py: the cheapest saving that makes a run fit, rung by rung."""
from __future__ import annotations

from dataclasses import replace

from memory_specs import LLAMA, run

from primus_ext.memory.fit_ladder import cheapest_fit
from primus_ext.memory.options import MemoryOptions
from primus_ext.memory.report import memory_report

OPT = MemoryOptions()


def _on_device(spec, hbm_bytes):
    hw = replace(spec.cluster.hardware, hbm_bytes=int(hbm_bytes))
    return replace(spec, cluster=replace(spec.cluster, hardware=hw))


def _peak(spec):
    return memory_report(spec, OPT).peak_bytes


def _with(spec, **train):
    return replace(spec, train=replace(spec.train, **train))


def _device_between(lo_spec, hi_spec):
    """A device size on which ``lo_spec`` fits (with the verdict's margin) and ``hi_spec``
    not."""
    margin = 1 + OPT.margin_fraction
    lo, hi = _peak(lo_spec) * margin, _peak(hi_spec) * margin
    assert lo < hi
    return (lo + hi) / 2


BASE = run(LLAMA, seq=4096, mbs=2, gbs=64)  # unfused attention: selective saves s^2 terms
# Fused attention: selective (core attention) saves little, so block recompute is needed.
FLASH = run(LLAMA, seq=4096, mbs=2, gbs=64, backend="flash")


def test_fits_as_stated_is_unchanged():
    choice = cheapest_fit(BASE, OPT)
    assert choice.step == "as_stated" and choice.spec is BASE and choice.note == ""


def test_selective_first_when_it_is_enough():
    sel = _with(BASE, recompute_granularity="selective")
    spec = _on_device(BASE, _device_between(sel, BASE))
    choice = cheapest_fit(spec, OPT)
    assert choice.step == "selective" and choice.fits
    assert choice.spec.train.recompute_granularity == "selective"
    assert "recompute_granularity=selective" in choice.note


def test_fewest_block_layers():
    """Between selective and full: the smallest k of block recompute that fits; k - 1
    does not."""
    sel = _with(FLASH, recompute_granularity="selective")
    block3 = _with(FLASH, recompute_granularity="full", recompute_method="block",
                   recompute_num_layers=3)
    block2 = _with(block3, recompute_num_layers=2)
    assert _peak(block2) < _peak(sel)  # selective alone does not fit on this device
    spec = _on_device(FLASH, _device_between(block3, block2))
    # Selective with the MLP recomputed as well is lighter than 3 whole layers and fits
    # here: it is the ladder's choice.
    heavy = cheapest_fit(spec, OPT)
    assert heavy.step == "selective"
    assert heavy.spec.train.recompute_modules == ("core_attn", "mlp")
    # With core attention as the only selective set, block recompute of 3 layers.
    choice = cheapest_fit(spec, OPT, module_sets=[("core_attn",)])
    assert choice.step == "block" and choice.spec.train.recompute_num_layers == 3
    assert choice.spec.train.recompute_method == "block"
    assert not memory_report(_on_device(block2, spec.cluster.hardware.hbm_bytes), OPT).fits
    assert "the first 3 of up to 8 layers" in choice.note


def test_full_or_nothing():
    full = _with(BASE, recompute_granularity="full", recompute_method="uniform",
                 recompute_num_layers=1)
    tiny = _on_device(BASE, _peak(full) * 0.5)
    choice = cheapest_fit(tiny, OPT)
    assert choice.step == "none" and not choice.fits and choice.spec is tiny
    assert "no recompute makes it fit" in choice.note


def test_stated_selective_starts_at_block():
    sel = _with(FLASH, recompute_granularity="selective")
    block8 = _with(FLASH, recompute_granularity="full", recompute_method="block",
                   recompute_num_layers=8)
    spec = _on_device(sel, _peak(block8) * 1.06)
    choice = cheapest_fit(spec, OPT, module_sets=[("core_attn",)])  # nothing new to add
    assert choice.step == "block" and choice.fits
    assert choice.spec.train.recompute_num_layers == 8
    wider = cheapest_fit(spec, OPT)  # a set containing core_attn: (core_attn, mlp)
    assert wider.step in ("selective", "block")
    if wider.step == "selective":
        assert set(wider.spec.train.recompute_modules) > {"core_attn"}


def test_moe_rungs_lightest_first():
    from memory_specs import MOE
    from primus_ext.memory.fit_ladder import selective_rungs
    spec = run(MOE, seq=4096, mbs=2, gbs=64, backend="flash")
    assert selective_rungs(spec) == [("moe_act",), ("core_attn",), ("core_attn", "moe_act"),
                                     ("core_attn", "mlp", "moe")]
