"""The flag table is consistent: every modelled flag names real spec fields, no flag is
both modelled and listed as having no effect, and argparse reads the table as written."""
from __future__ import annotations

import dataclasses

import pytest

from primus_ext.frameworks.megatron.args import parse_launch_args
from primus_ext.frameworks.megatron.no_effect import NO_EFFECT
from primus_ext.frameworks.megatron.table import BY_NAME, FLAGS
from primus_ext.spec import ModelSpec, ParallelSpec, TrainSpec

_GROUPS = {"model": ModelSpec, "parallel": ParallelSpec, "train": TrainSpec}


def test_every_flag_names_real_spec_fields():
    for f in FLAGS:
        for field in f.fields:
            group, name = field.split(".")
            names = {x.name for x in dataclasses.fields(_GROUPS[group])}
            assert name in names, (f.name, field)


def test_no_flag_is_both_modelled_and_no_effect():
    assert len(BY_NAME) == len(FLAGS)
    assert sorted(set(BY_NAME) & set(NO_EFFECT)) == []


def test_absent_flags_take_megatron_defaults_from_the_table():
    la = parse_launch_args(["--num-layers", "2", "--hidden-size", "64",
                            "--num-attention-heads", "4", "--seq-length", "128",
                            "--max-position-embeddings", "128",
                            "--target-nodes", "1", "--target-hardware", "h100"])
    m, p, t = la.spec.model, la.spec.parallel, la.spec.train
    assert m.normalization == BY_NAME["--normalization"].default
    assert m.position_embedding_type == BY_NAME["--position-embedding-type"].default
    assert m.hidden_dropout == BY_NAME["--hidden-dropout"].default
    assert m.make_vocab_size_divisible_by == BY_NAME["--make-vocab-size-divisible-by"].default
    assert (p.tp, p.pp, p.cp, p.ep) == (1, 1, 1, 1)
    assert t.micro_batch_size == BY_NAME["--micro-batch-size"].default
    assert t.optimizer == BY_NAME["--optimizer"].default
    assert any("ASSUMED 32000" in n for n in la.notes)  # no tokenizer flags at all


def test_a_line_without_max_position_embeddings_is_refused_as_megatron_refuses_it():
    # Megatron-LM core_v0.16.1 arguments.py:799 (required_args): "max_position_embeddings
    # argument is None".
    with pytest.raises(ValueError, match="max_position_embeddings argument is None"):
        parse_launch_args(["--num-layers", "2", "--hidden-size", "64",
                           "--num-attention-heads", "4", "--seq-length", "128",
                           "--target-nodes", "1", "--target-hardware", "h100"])
