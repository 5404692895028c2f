"""Sharded candidate evaluation (tune/shard.py): shards cover the exhaustive search's
points once each, their journals merge into the scores the driver reuses, and the
driver's search, journal and winner are those of a run in one process."""
from __future__ import annotations

import json

import pytest

from primus_ext.tune.run import tune
from primus_ext.tune.settings import TuneSettings
from primus_ext.tune.shard import (evaluate_shard, planned_points, read_shards,
                                   shard_file, shard_plan, shard_points)
from primus_ext.tune.space import space_of
from test_space import _spec

# Llama 3.1 8B on one H100 node: a space small enough to score exhaustively in a test,
# with layouts that fit, layouts that do not, and illegal ones.
SPACE = {"tp": [1, 2, 4], "pp": [1, 2], "cp": [1], "micro_batch_size": [1, 2],
         "num_nodes": [1], "hardware": ["h100"]}


def _settings(out_dir=None, **kw) -> TuneSettings:
    return TuneSettings.from_dict({"progress": False, "reference": None, "space": SPACE,
                                   "out_dir": out_dir, **kw})


def _job():
    return _spec("llama3.1_8b", nodes=1, gbs=64)


def _records(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_shards_partition_the_planned_points():
    space = space_of(_job(), _settings())
    points = planned_points(space, _settings())
    assert points == space.legal_points() and len(points) > 5
    shards = [shard_points(points, i, 3) for i in range(3)]
    assert sorted(p for s in shards for p in s) == sorted(points)
    assert shard_points(points, 0, 1) == points
    with pytest.raises(ValueError, match=r"shard index=3 must be an integer in \[0, 3\)"):
        shard_points(points, 3, 3)
    with pytest.raises(ValueError, match="shards=0 must be an integer >= 1"):
        shard_points(points, 0, 0)


def test_guided_search_has_no_planned_points():
    space = space_of(_job(), _settings())
    assert planned_points(space, _settings(strategy="guided")) is None
    assert shard_plan(space, _settings(strategy="guided")) is None  # one cluster
    two = _settings(strategy="guided", space={**SPACE, "num_nodes": [1, 2]})
    assert shard_plan(space_of(_job(), two), two) == "clusters"


def test_guided_search_over_clusters_sharded_equals_one_process(tmp_path):
    """Each shard searches its clusters; the driver replays the whole search and finds
    every score it needs in the shards."""
    space = {"num_nodes": [1, 2, 4], "hardware": ["h100", "a100"]}
    settings = _settings(strategy="guided", space=space, budget={"candidates": 25})
    one = tune(_job(), settings, write=False)
    for i in range(2):
        evaluate_shard(_job(), settings, i, 2, tmp_path)
    scores = read_shards(tmp_path, 2)

    def never(spec):
        raise AssertionError(f"scored again in the driver: {spec.layout.describe()}")
    merged = tune(_job(), settings, prefetched=scores, project_fn=never, write=False)
    assert [t.to_record() for t in merged.trials] == [t.to_record() for t in one.trials]
    assert merged.best.point == one.best.point
    searched = {(t.candidate["num_nodes"], t.candidate["hardware"]) for t in merged.trials}
    assert searched == {(n, h) for n in (1, 2, 4) for h in ("h100", "a100")}


def test_sharded_run_equals_one_process(tmp_path):
    one = tune(_job(), _settings(str(tmp_path / "one")))
    shard_dir = tmp_path / "shards"
    for i in range(3):
        evaluate_shard(_job(), _settings(), i, 3, shard_dir)
    scores = read_shards(shard_dir, 3)
    # every legal point, and the planner's (its memory relief may leave the axes)
    assert set(scores) >= set(space_of(_job(), _settings()).legal_points())

    def never(spec):  # every point the search scores was scored by a shard
        raise AssertionError(f"scored again in the driver: {spec.layout.describe()}")
    # the real memory model (the planner's fit ladder reads it), no projector
    merged = tune(_job(), _settings(str(tmp_path / "merged")), prefetched=scores,
                  project_fn=never, write=False)
    assert [t.to_record() for t in merged.trials] == [t.to_record() for t in one.trials]
    assert merged.best.point == one.best.point and merged.best.score == one.best.score
    assert merged.stats["evaluated"] == one.stats["evaluated"]
    assert merged.stats["projected"] == one.stats["projected"]
    # the driver's journal is the one-process journal, line for line
    final = tune(_job(), _settings(str(tmp_path / "merged")), prefetched=scores)
    assert (tmp_path / "merged" / "trials.jsonl").read_text() == \
        (tmp_path / "one" / "trials.jsonl").read_text()
    assert (tmp_path / "merged" / "overrides.txt").read_text() == \
        (tmp_path / "one" / "overrides.txt").read_text()
    assert final.best.point == one.best.point


def test_missing_or_foreign_shards_are_named(tmp_path):
    evaluate_shard(_job(), _settings(), 0, 2, tmp_path)
    with pytest.raises(ValueError, match=r"shard 1 of 2 wrote no results"):
        read_shards(tmp_path, 2)
    evaluate_shard(_job(), _settings(), 1, 2, tmp_path)
    assert len(read_shards(tmp_path, 2)) >= len(
        space_of(_job(), _settings()).legal_points())
    # shard 1's file holding shard 0's points with other figures
    text = shard_file(tmp_path, 0, 2).read_text().replace('"index": 0, "count": 2',
                                                          '"index": 1, "count": 2', 1)
    shard_file(tmp_path, 1, 2).write_text(text.replace('"step_time_s": ',
                                                       '"step_time_s": 1', 1))
    with pytest.raises(ValueError, match="scored differently by two shards"):
        read_shards(tmp_path, 2)
    shard_file(tmp_path, 1, 2).write_text(text)  # the same points again: too few
    with pytest.raises(ValueError, match="planned different searches"):
        read_shards(tmp_path, 2)
    shard_file(tmp_path, 1, 2).write_text('{"kind": "header"}\n')
    with pytest.raises(ValueError, match="not the results of shard 1 of 2"):
        read_shards(tmp_path, 2)
