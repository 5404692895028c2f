"""trials.jsonl: one record per trial, flushed as it happens; Ctrl-C leaves a valid
journal and a recipe of the best so far; tune.resume=true continues where it stopped."""
from __future__ import annotations

import json

import pytest
from tune_fakes import fake_memory, fake_project

from primus_ext.tune.journal import Journal, read_journal
from primus_ext.tune.run import tune
from test_space import _spec

SETTINGS = dict(progress=False, reference=None, strategy="guided")


class Interrupting:
    """The fake projector, pressing Ctrl-C on its n-th call."""

    def __init__(self, n: int):
        self.n, self.calls = n, 0

    def __call__(self, spec):
        self.calls += 1
        if self.calls == self.n:
            raise KeyboardInterrupt
        return fake_project(spec)


def _records(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_journal_has_every_trial(tmp_path):
    r = tune(_spec(), {**SETTINGS, "out_dir": str(tmp_path)}, memory_fn=fake_memory,
             project_fn=fake_project)
    recs = _records(tmp_path / "trials.jsonl")
    assert recs[0]["kind"] == "header" and recs[0]["job"]["model"] == "llama3.1_70b"
    trials = [x for x in recs if x["kind"] == "trial"]
    assert len(trials) == len(r.trials)
    assert [t["index"] for t in trials] == list(range(len(trials)))
    for t in trials:
        assert set(t) >= {"candidate", "source", "verdict", "estimate"}
        assert t["source"] in ("baseline", "planner", "search")
        if t["verdict"] == "ok":
            assert t["estimate"]["tokens_per_s_per_gpu"] > 0
            assert set(t["estimate"]["breakdown"]) >= {"compute_s", "pp_bubble_s"}


def test_interrupt_then_resume_reaches_the_same_answer(tmp_path):
    full = tune(_spec(), {**SETTINGS, "out_dir": str(tmp_path / "full")},
                memory_fn=fake_memory, project_fn=fake_project)
    out = tmp_path / "run"
    stop = Interrupting(40)
    cut = tune(_spec(), {**SETTINGS, "out_dir": str(out)}, memory_fn=fake_memory,
               project_fn=stop)
    assert cut.interrupted and cut.best is not None
    assert (out / "overrides.txt").is_file() and (out / "report.md").is_file()
    assert "interrupted" in (out / "report.md").read_text()
    header, done, _ = read_journal(out / "trials.jsonl")
    assert header is not None and len(done) == len(cut.trials)
    calls = {"n": 0}

    def counting(spec):
        calls["n"] += 1
        return fake_project(spec)

    resumed = tune(_spec(), {**SETTINGS, "out_dir": str(out), "resume": True},
                   memory_fn=fake_memory, project_fn=counting)
    assert not resumed.interrupted
    assert resumed.best.point == full.best.point
    assert resumed.best.score == pytest.approx(full.best.score)
    _, recs, _ = read_journal(out / "trials.jsonl")
    points = [tuple(sorted(r["candidate"].items(), key=lambda kv: kv[0])) for r in recs]
    assert len(points) == len(set(points))  # nothing evaluated twice
    assert len(recs) == len(full.trials)
    projected_before = sum(r["verdict"] == "ok" for r in done)
    assert calls["n"] <= full.stats["projected"] - projected_before + 1  # +1: the winner


def test_resume_drops_a_half_written_line(tmp_path):
    out = tmp_path / "run"
    tune(_spec(), {**SETTINGS, "out_dir": str(out), "budget": {"candidates": 30}},
         memory_fn=fake_memory, project_fn=fake_project)
    path = out / "trials.jsonl"
    good = path.read_bytes()
    path.write_bytes(good + b'{"kind": "trial", "index": 999, "cand')
    header, recs, valid = read_journal(path)
    assert valid == len(good)
    r = tune(_spec(), {**SETTINGS, "out_dir": str(out), "resume": True,
                       "budget": {"candidates": 60}},
             memory_fn=fake_memory, project_fn=fake_project)
    for line in path.read_text().splitlines():
        json.loads(line)  # every line is whole again
    assert r.stats["evaluated"] <= 60


def test_resume_refuses_another_jobs_journal(tmp_path):
    out = tmp_path / "run"
    tune(_spec(), {**SETTINGS, "out_dir": str(out), "budget": {"candidates": 10}},
         memory_fn=fake_memory, project_fn=fake_project)
    with pytest.raises(ValueError, match="journal of another job"):
        tune(_spec(gbs=256), {**SETTINGS, "out_dir": str(out), "resume": True},
             memory_fn=fake_memory, project_fn=fake_project)


def test_journal_appends_whole_lines(tmp_path):
    with Journal(tmp_path / "j.jsonl", {"job": {"x": 1}, "job_key": "k"}) as j:
        j.append({"kind": "trial", "score": float("nan"), "candidate": {}})
    header, recs, _ = read_journal(tmp_path / "j.jsonl")
    assert header["job_key"] == "k" and recs[0]["score"] is None
