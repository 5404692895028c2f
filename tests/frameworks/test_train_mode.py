"""mode=train (the validation job of validate_top_k): which line it trains, and where it
refuses to run (the training itself: tests/slow/test_validate_top_k.py)."""
from __future__ import annotations

from primus_ext import compose
from primus_ext.frameworks.megatron.flags import megatron_argv
from primus_ext.frameworks.megatron.runner import local_hardware
from primus_ext.modes.train import recipe_line, why_not_here


def test_the_line_is_the_recipes_with_its_iterations():
    spec = compose(["model=llama3_debugmodel", "cluster.hardware=cpu", "cluster.num_nodes=1",
                    "train.seq_length=128", "train.global_batch_size=4"])
    line, recipe = recipe_line(spec, 4), megatron_argv(spec)
    i = line.index("--train-iters")
    assert line[i + 1] == "4" and len(line) == len(recipe)
    assert line[:i + 1] == recipe[:i + 1] and line[i + 2:] == recipe[i + 2:]
    if local_hardware() == "cpu":
        assert why_not_here(spec) is None  # this machine: a CPU, 2 processes


def test_a_job_for_another_cluster_says_why_it_did_not_run():
    spec = compose(["model=llama3_8b", "cluster.hardware=h100", "cluster.num_nodes=2"])
    assert "needs 2 nodes" in why_not_here(spec)
    one = compose(["model=llama3_8b", "cluster.hardware=h100", "cluster.num_nodes=1"])
    here = local_hardware()
    if here != "h100":
        assert f"is for h100; this machine has {here}" in why_not_here(one)
