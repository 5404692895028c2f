"""The default (guided) search against the exhaustive optimum with the real projector:
Llama 3.1 70B on 64 H100, GBS 128, seq 8192, BF16. The default search, under its
default budget (candidates and seconds), must land within 1% of the best layout of the
whole legal space, with a fraction of its evaluations. (Takes about 20 s: the exhaustive
search projects every fitting layout; scripts/bench_tune.py prints both cases.)"""
from __future__ import annotations

import pytest

from primus_ext.tune.run import tune

pytestmark = pytest.mark.slow

LLAMA = ["model=llama3.1_70b", "cluster.hardware=h100", "cluster.num_nodes=8",
         "train.global_batch_size=128", "train.seq_length=8192", "train.precision=bf16",
         "tune.progress=false", "tune.reference=null"]


def test_default_search_is_within_one_percent_of_the_exhaustive_optimum():
    default = tune(LLAMA + ["tune.budget.candidates=1500", "tune.budget.seconds=60"],
                   write=False)
    exhaustive = tune(LLAMA + ["tune.strategy=exhaustive"], write=False)
    # every legal point, plus the fit ladder's relief of the baseline where that lies
    # off the recompute axis (e.g. full recompute of the fewest blocks that fit)
    assert exhaustive.stats["evaluated"] - exhaustive.stats["off_axis"] == \
        exhaustive.space["num_legal"]
    assert default.strategy == "guided"
    assert default.stats["evaluated"] <= 1500
    best = default.best.metrics["tokens_per_s_per_gpu"]
    optimum = exhaustive.best.metrics["tokens_per_s_per_gpu"]
    assert best >= 0.99 * optimum, (default.best.point, exhaustive.best.point)
    assert default.stats["evaluated"] < exhaustive.stats["evaluated"] / 3
