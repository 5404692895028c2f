"""Issue 15, defects 8-11 through the app: one clear line for every user error (the
traceback only with HYDRA_FULL_ERROR=1), options that do not exist are refused, a long
pipeline's trace is capped and says so, the drop-in names its default target."""
from __future__ import annotations

import json

import pytest
from app import app

from primus_ext.config import compose
from primus_ext.project.estimate import project
from primus_ext.project.trace import to_chrome_trace


def _one_clear_line(run, *needles):
    assert run.returncode == 2, (run.returncode, run.stderr)
    assert "Traceback" not in run.stderr
    assert len(run.error_lines) == 1, run.stderr
    for n in needles:
        assert n in run.error_lines[0], run.error_lines[0]


def test_trace_into_a_directory(tmp_path):
    run = app([f"trace={tmp_path}"], tmp_path / "home")
    _one_clear_line(run, f"trace={str(tmp_path)!r} is a directory")
    full = app([f"trace={tmp_path}"], tmp_path / "home", full_error=True)
    assert full.returncode != 0 and "Traceback" in full.stderr


def test_plot_under_a_file(tmp_path):
    (tmp_path / "f").write_text("")
    run = app([f"plot={tmp_path / 'f' / 'x.png'}"], tmp_path / "home")
    _one_clear_line(run, "plot=", "a parent of it is a file")


def test_validate_out_into_a_directory(tmp_path):
    run = app(["mode=validate", f"out={tmp_path}"], tmp_path / "home")
    _one_clear_line(run, f"out={str(tmp_path)!r} is a directory")


def test_tune_out_dir_that_is_a_file(tmp_path):
    f = tmp_path / "recipe"
    f.write_text("")
    run = app(["mode=tune", "tune.budget.candidates=5", "tune.progress=false",
               f"tune.out_dir={f}"], tmp_path / "home")
    _one_clear_line(run, f"tune.out_dir={str(f)!r} is a file")


@pytest.mark.parametrize("body", [{"schema_version": 1, "layers": 5},
                                  {"schema_version": 1}, [1, 2], "x"])
def test_malformed_profile(tmp_path, body):
    p = tmp_path / "p.json"
    p.write_text(json.dumps(body))
    run = app(["backend=profile", f"profile={p}"], tmp_path / "home")
    _one_clear_line(run, f"profile={p}")


def test_unknown_output_is_refused(tmp_path):
    run = app(["output=xml"], tmp_path / "home")
    _one_clear_line(run, "output='xml' must be one of table, json")


def test_tp_abc_names_tp(tmp_path):
    run = app(["parallel.tp=abc"], tmp_path / "home")
    _one_clear_line(run, "parallel.tp='abc'")
    assert "sequence_parallel" not in run.stderr


def test_budget_candidates_zero_is_named_as_typed(tmp_path):
    run = app(["mode=tune", "tune.budget.candidates=0"], tmp_path / "home")
    _one_clear_line(run, "tune.budget.candidates=0 must be a positive integer")


# ---- defect 10 --------------------------------------------------------------------
def test_trace_is_capped_and_says_so(tmp_path):
    out = tmp_path / "t.json"
    run = app(["train.global_batch_size=4096", f"trace={out}", "trace_max_events=1000"],
              tmp_path / "home")
    assert run.returncode == 0, run.stderr
    trace = json.loads(out.read_text())
    info = trace["primus_ext"]
    assert info["truncated"] and info["ops_drawn"] == 1000 and info["ops_total"] == 2048
    assert sum(e.get("cat") in ("forward", "backward") for e in trace["traceEvents"]) == 1000
    assert "drew the first 1,000 of 2,048 ops" in run.stderr


def test_uncapped_trace_is_whole():
    est = project(compose(["parallel.pp=4", "parallel.cp=1", "train.global_batch_size=64"]),
                  record_timeline=True)
    full = to_chrome_trace(est.timeline, max_events=None)
    assert not full["primus_ext"]["truncated"]
    assert full["primus_ext"]["ops_drawn"] == len(est.timeline.events)
    cut = to_chrome_trace(est.timeline, max_events=10)
    ops = [e for e in cut["traceEvents"] if e.get("cat") in ("forward", "backward")]
    assert len(ops) == 10
    end = cut["primus_ext"]["drawn_until_s"] * 1e6
    assert all(e["ts"] < end for e in cut["traceEvents"] if e.get("ph") == "X")


# ---- defect 11 --------------------------------------------------------------------
TINY = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
        "--seq-length", "128", "--max-position-embeddings", "128",
        "--micro-batch-size", "1", "--global-batch-size", "2"]


def test_dropin_names_its_default_target(monkeypatch):
    from primus_ext.frameworks.megatron.args import parse_launch_args
    for k in ("NNODES", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GPUS_PER_NODE",
              "PRIMUS_TARGET_HARDWARE"):
        monkeypatch.delenv(k, raising=False)
    with pytest.raises(ValueError) as err:
        parse_launch_args(TINY)
    msg = str(err.value)
    assert "global_batch_size=2" in msg
    assert "target: the default, 1 node(s) x 8 h100" in msg and "--target-hardware" in msg
    named = parse_launch_args(TINY + ["--target-hardware", "cpu", "--target-nodes", "1",
                                      "--target-gpus-per-node", "2"])
    assert named.spec.world_size == 2 and named.target_note is None
    default = parse_launch_args(TINY[:-1] + ["8"])  # a batch the default target takes
    assert default.target_note.startswith("target: the default, 1 node(s) x 8 h100")
    with pytest.raises(ValueError) as err:  # a named target: no note
        parse_launch_args(TINY + ["--target-nodes", "2"])
    assert "target: the default" not in str(err.value)
