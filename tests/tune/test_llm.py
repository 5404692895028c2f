"""The LLM investigation loop against a real OpenAI-compatible HTTP server on
127.0.0.1 driven by the real openai client: good answers are scored and fed back;
broken JSON, illegal or off-axis candidates, a reply slower than the client timeout, a
500 and an unreachable port are logged and survived."""
from __future__ import annotations

import json

import pytest
from llm_server import ScriptedServer, unused_port
from tune_fakes import fake_memory, fake_project

from primus_ext.tune.llm import parse_answer
from primus_ext.tune.run import tune
from primus_ext.tune.space import as_dict
from test_space import _spec

SPACE = {"tp": [1, 2, 4, 8], "pp": [1, 2, 4, 8], "cp": [1, 2], "micro_batch_size": [1, 2]}


def _settings(base_url: str, **llm) -> dict:
    return {"progress": False, "reference": None, "strategy": "guided", "space": SPACE,
            # A tiny search budget leaves the LLM something to find.
            "budget": {"candidates": 8, "seconds": None}, "restarts": 1,
            "llm": {"enabled": True, "base_url": base_url, "api_key": "test-key",
                    "model": "scripted", "timeout_s": 0.5, "max_rounds": 4,
                    "max_failures": 2, **llm}}


def _run(settings):
    # A baseline that fits, so the search has an incumbent for the LLM to improve.
    return tune(_spec(tp=4, pp=4, sequence_parallel=True), settings, memory_fn=fake_memory, project_fn=fake_project,
                write=False)


@pytest.fixture(scope="module")
def optimum():
    r = tune(_spec(), {"progress": False, "reference": None, "strategy": "exhaustive",
                       "space": SPACE}, memory_fn=fake_memory, project_fn=fake_project,
             write=False)
    return r.best


def _answer(*candidates) -> str:
    return json.dumps({"candidates": [{"hypothesis": h, "changes": c}
                                      for h, c in candidates]})


def test_good_answers_are_scored_and_fed_back(optimum):
    best = as_dict(optimum.point)
    changes = {k: best[k] for k in ("tp", "pp", "vpp", "cp", "micro_batch_size",
                                    "recompute", "sharding")}
    script = [("answer", "```json\n" + _answer(("fewer bubbles with deeper PP", changes),
                                               ("try CP", {"cp": 2})) + "\n```"),
              ("answer", _answer(("plain DDP sharding", {"sharding": "distributed_optimizer"})))]
    with ScriptedServer(script) as srv:
        r = _run(_settings(srv.base_url))
    assert len(srv.requests) == 2
    first = srv.requests[0]["body"]
    assert first["model"] == "scripted"
    prompt = first["messages"][1]["content"]
    assert '"axes"' in prompt and '"best_trials"' in prompt and "breakdown_s" in prompt
    # Round two hears how round one's proposals fared.
    fed_back = srv.requests[1]["body"]["messages"][1]["content"]
    assert "fewer bubbles with deeper PP" in fed_back
    llm_trials = [t for t in r.trials if t.source == "llm"]
    assert llm_trials and llm_trials[0].hypothesis == "fewer bubbles with deeper PP"
    assert r.best.score == pytest.approx(optimum.score)
    assert r.best.source == "llm"
    assert [rnd.ok for rnd in r.llm_rounds] == [True, True]  # stopped: no improvement


def test_broken_answers_are_survived(optimum):
    best = as_dict(optimum.point)
    script = [
        ("answer", "Sure! Here are my ideas: {candidates: [tp=4"),  # not JSON
        ("answer", _answer(("tp 3 is off the axis", {"tp": 3}),
                           ("too many GPUs", {"tp": 8, "pp": 8, "cp": 2}),
                           ("unknown axis", {"tensor_parallel": 2}),
                           ("a list value", {"tp": [2]}))
         + '\n{"candidates": "not a list"}'),  # trailing junk around the object
        ("answer", json.dumps({"candidates": ["just a string",
                                              {"hypothesis": "no changes key"}]})),
        ("answer", _answer(("the real one", {k: best[k] for k in ("tp", "pp", "vpp",
                                                                   "cp", "micro_batch_size",
                                                                   "recompute",
                                                                   "sharding")}))),
    ]
    with ScriptedServer(script) as srv:
        r = _run(_settings(srv.base_url, max_rounds=4, max_failures=4))
    rounds = r.llm_rounds
    assert not rounds[0].ok and "malformed" in rounds[0].error
    # The junk-wrapped answer parses as a whole or fails as a whole; either way survived.
    verdicts = [p.get("verdict") for rnd in rounds for p in rnd.proposals]
    assert "invalid" in verdicts
    assert not rounds[2].ok and "no proposal could be scored" in rounds[2].error
    assert rounds[3].ok
    assert r.best.score == pytest.approx(optimum.score)


def test_illegal_and_off_axis_candidates_are_rejected_with_reasons():
    script = [("answer", _answer(("tp 3 is off the axis", {"tp": 3}),
                                 ("too many GPUs", {"tp": 8, "pp": 8, "cp": 2}),
                                 ("unknown axis", {"tensor_parallel": 2})))]
    with ScriptedServer(script) as srv:
        r = _run(_settings(srv.base_url, max_rounds=1))
    props = r.llm_rounds[0].proposals
    by_hyp = {p["proposal"]["hypothesis"]: p for p in props}
    assert by_hyp["tp 3 is off the axis"]["verdict"] == "out_of_space"
    assert by_hyp["too many GPUs"]["verdict"] == "illegal"
    assert "not divisible" in by_hyp["too many GPUs"]["reason"]
    assert by_hyp["unknown axis"]["verdict"] == "invalid"
    assert r.best is not None


def test_timeout_and_server_error_end_the_loop_not_the_tuner():
    script = [("slow", 3.0, _answer(("late", {"tp": 2}))), ("status", 500)]
    with ScriptedServer(script) as srv:
        r = _run(_settings(srv.base_url, timeout_s=0.5))
    assert len(r.llm_rounds) == 2
    assert "Timeout" in r.llm_rounds[0].error
    assert "500" in r.llm_rounds[1].error or "InternalServerError" in r.llm_rounds[1].error
    assert r.best is not None and all(t.source != "llm" for t in r.trials)


def test_unreachable_endpoint():
    url = f"http://127.0.0.1:{unused_port()}/v1"
    r = _run(_settings(url))
    assert len(r.llm_rounds) == 2  # max_failures
    assert all(not rnd.ok and "Connection" in rnd.error for rnd in r.llm_rounds)
    assert r.best is not None


def test_no_endpoint_configured(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    s = _settings(None)
    s["llm"]["api_key"] = None
    r = _run(s)
    assert r.llm_rounds == [] and "skipped" in r.llm_note


def test_parse_answer():
    assert parse_answer('{"candidates": [{"changes": {"tp": 2}}]}') == [{"changes": {"tp": 2}}]
    assert parse_answer('text ```json\n[{"changes": {}}]\n``` more') == [{"changes": {}}]
    for bad in ("", "no json here", '{"candidates": 3}', "{broken"):
        with pytest.raises(ValueError):
            parse_answer(bad)
