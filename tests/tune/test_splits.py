"""Uneven pipeline splits the tuner states: the ones Megatron-LM accepts, most balanced."""
from __future__ import annotations

import dataclasses

import pytest

from primus_ext.spec import ParallelSpec, pipeline_layout
from primus_ext.tune.splits import megatron_split, pp_sizes


def _counts(layers, pp, vpp):
    fields = megatron_split(layers, pp, vpp)
    par = dataclasses.replace(ParallelSpec(), pp=pp, vpp=vpp, **fields)
    lay = pipeline_layout(layers, par)
    return [lay.stage_num_layers(s) for s in range(pp)]


def test_405b_at_pp16_is_the_published_split():
    # Llama 3.1 405B (126 layers) at PP 16: 7 on the first and last stage, 8 elsewhere
    # (the embedding and the loss weigh one layer each).
    assert _counts(126, 16, 1) == [7] + [8] * 14 + [7]


@pytest.mark.parametrize("layers,pp,vpp", [(126, 16, 1), (126, 8, 2), (61, 4, 1),
                                           (94, 8, 1), (96, 5, 1)])
def test_split_places_every_layer_and_is_balanced(layers, pp, vpp):
    counts = _counts(layers, pp, vpp)
    assert sum(counts) == layers and min(counts) >= 1
    loads = [c + (s == 0) + (s == pp - 1) for s, c in enumerate(counts)]
    # No stage carries more than the even share of layers + embedding + loss, rounded up.
    assert max(loads) <= -(-(layers + 2) // pp) + vpp


def test_only_split_megatron_accepts_is_taken_however_unbalanced():
    # 80 layers over PP 32: the account-for flags need 82 or 81 to divide by 32; the
    # middle 30 stages take 60 or 30 layers: 10 + 30 x 2 + 10 is the most balanced.
    assert _counts(80, 32, 1) == [10] + [2] * 30 + [10]


def test_even_layers_take_no_flags_and_impossible_splits_none():
    assert megatron_split(80, 4, 1)["decoder_first_pipeline_num_layers"] is None
    assert not any(megatron_split(80, 4, 1).values())
    assert megatron_split(3, 8, 1) is None  # fewer layers than stages


def test_pp_sizes_hold_every_world_divisor_with_a_split():
    assert pp_sizes(126, 512) == [1, 2, 3, 4, 6, 7, 8, 9, 14, 16, 18, 21, 32, 42, 63, 64, 126]
