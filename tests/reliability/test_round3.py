"""Issue 26 (third reliability round) through the app: special files, scale, typed
top-level keys, unread overrides, clear errors, and what a user sees (piped output,
notes, run directories, sweep job directories)."""
from __future__ import annotations

import csv
import json
import os
import stat

import pytest
from app import app

from primus_ext.comm import groups
from primus_ext.config import compose
from primus_ext.util.files import atomic_write_text


def _one_clear_line(run, *needles):
    assert run.returncode == 2, (run.returncode, run.stdout[-500:], run.stderr)
    assert "Traceback" not in run.stderr
    assert len(run.error_lines) == 1, run.stderr
    for n in needles:
        assert n in run.error_lines[0], run.error_lines[0]


# ---- loss and corruption ---------------------------------------------------------------
def test_output_to_a_named_pipe_is_refused_and_the_pipe_kept(tmp_path):
    fifo = tmp_path / "p"
    os.mkfifo(fifo)
    run = app(["mode=validate", f"out={fifo}", "runs=golden"], tmp_path / "home")
    _one_clear_line(run, "out=", "named pipe")
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)


def test_output_to_a_device_is_refused(tmp_path):
    run = app(["mode=describe", "output=json", "plot=/dev/null", "mode=memory"],
              tmp_path / "home")
    _one_clear_line(run, "plot=", "character device")
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


@pytest.mark.parametrize("key", ["runs", "calibration"])
def test_inputs_that_are_pipes_or_directories(tmp_path, key):
    fifo = tmp_path / "p"
    os.mkfifo(fifo)
    mode = "mode=validate" if key == "runs" else "mode=project"
    _one_clear_line(app([mode, f"{key}={fifo}"], tmp_path / "home"), f"{key}=",
                    "named pipe")
    _one_clear_line(app([mode, f"{key}={tmp_path}"], tmp_path / "home"), f"{key}=",
                    "is a directory")


def test_write_errors_name_the_setting_and_path(tmp_path, monkeypatch):
    import errno

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(ValueError, match=r"trace='.*t.json': No space left on device"):
        atomic_write_text(tmp_path / "t.json", "{}", "trace")
    assert not list(tmp_path.iterdir())  # no temp file left behind


def test_unwritable_directory_names_the_setting():
    with pytest.raises(ValueError, match=r"plot='/sys/x.png': cannot write into '/sys'"):
        atomic_write_text("/sys/x.png", "x", "plot")


def test_group_spans_do_not_enumerate_the_data_parallel_group():
    spec = compose(["cluster.num_nodes=100000000", "train.global_batch_size=800000000",
                    "parallel.cp=1"])
    dp = groups.group_span(spec, "dp")
    assert (dp.size, dp.num_nodes, dp.ranks_per_node) == (800_000_000, 100_000_000, 8)


def test_closed_form_spans_match_enumeration():
    import itertools
    for sizes in itertools.product((1, 2, 3, 4, 8), repeat=3):
        for mask in itertools.product((0, 1), repeat=3):
            dims, stride = [], 1
            for n, m in zip(sizes, mask):
                if m:
                    dims.append((n, stride))
                stride *= n
            for block in (4, 8, 72):
                assert groups._blocks(dims, block) == groups._enumerated(dims, block)


def test_validate_shares_repeated_configurations(tmp_path):
    from primus_ext.published import DEFAULT_PATH
    rows = list(csv.DictReader(open(DEFAULT_PATH)))
    path = tmp_path / "many.csv"
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        for i in range(600):
            w.writerow({**rows[i % 12], "run_id": f"X{i}"})
    run = app(["mode=validate", f"runs={path}", f"out={tmp_path / 'o.csv'}"],
              tmp_path / "home")
    assert run.returncode == 0, run.stderr
    assert "the first 200 of 600 rows" in run.stdout
    out = list(csv.DictReader(open(tmp_path / "o.csv")))
    assert len(out) == 600
    # a row and its repeat project alike, each under its own run_id
    assert out[0]["tokens_per_s_per_gpu"] == out[12]["tokens_per_s_per_gpu"]
    assert [r["run_id"] for r in out[:2]] == ["X0", "X1"]


def test_progress_lines_off_a_terminal():
    import io

    from primus_ext.emit.work_progress import WorkProgress
    stream = io.StringIO()
    with WorkProgress("validate", 3, stream=stream, every_s=0.0) as progress:
        for _ in range(3):
            progress.advance()
    lines = stream.getvalue().splitlines()
    assert lines[0].startswith("primus-ext validate: 1 of 3 rows (")
    assert "rows/s" in lines[-1] and "3 of 3" in lines[-1]


# ---- silent wrong results --------------------------------------------------------------
def test_calibrate_out_default_is_refused(tmp_path):
    run = app(["mode=calibrate", "out=default", "loso=false"], tmp_path / "home")
    _one_clear_line(run, "out='default'", "calibration=default")
    assert not (tmp_path / "default").exists()


def test_newline_in_any_text_field(tmp_path):
    run = app(["+cluster.hardware_overrides.source='a\nb'"], tmp_path / "home")
    _one_clear_line(run, "cluster.hardware_overrides.source", "one line")


def test_layout_note_follows_an_override(tmp_path):
    same = app([], tmp_path / "home")
    assert "layout from NVIDIA's Llama 3 8B" in same.stdout
    moved = app(["parallel.cp=1"], tmp_path / "home")
    assert moved.returncode == 0
    assert "layout from NVIDIA" not in moved.stdout
    assert "layout set by parallel.cp=1" in moved.stdout


def test_loso_must_be_a_boolean(tmp_path):
    _one_clear_line(app(["mode=calibrate", "loso=maybe"], tmp_path / "home"), "loso=")


def test_an_override_the_mode_does_not_read(tmp_path):
    run = app(["mode=measure", f"out={tmp_path / 'x'}"], tmp_path / "home")
    _one_clear_line(run, "out=", "mode=measure", "profile=")


# ---- tracebacks and unclear errors -----------------------------------------------------
@pytest.mark.parametrize("value", ["lots", "-5", "0", "true"])
def test_trace_max_events_is_typed(tmp_path, value):
    run = app([f"trace={tmp_path / 't.json'}", f"trace_max_events={value}"],
              tmp_path / "home")
    _one_clear_line(run, "trace_max_events=")


def test_a_bad_value_in_a_sweep_is_that_jobs_result(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run = app(["-m", "trace_max_events=5,lots", "mode=project"], tmp_path / "home")
    assert run.returncode == 0, run.stderr
    summary = list(tmp_path.glob("multirun/*/*/summary.csv"))
    assert summary, run.stdout
    text = summary[0].read_text()
    assert "trace_max_events" in text and "illegal" in text
    # every job keeps its composed config, and its full output beside it
    assert list(tmp_path.glob("multirun/*/*/0/.hydra/config.yaml"))
    assert list(tmp_path.glob("multirun/*/*/0/output.txt"))


def test_calibration_file_holding_a_list(tmp_path):
    path = tmp_path / "c.json"
    path.write_text("[1, 2]")
    _one_clear_line(app([f"calibration={path}"], tmp_path / "home"), "calibration=",
                    "JSON list")


@pytest.mark.parametrize("target", ["dir", "under_file"])
def test_dropin_projection_out(tmp_path, target):
    from primus_ext.frameworks.megatron.args import parse_launch_args
    (tmp_path / "f").write_text("")
    path = tmp_path if target == "dir" else tmp_path / "f" / "x.json"
    with pytest.raises(ValueError, match="--projection-out="):
        parse_launch_args(["--num-layers", "2", "--hidden-size", "64",
                           "--num-attention-heads", "4", "--seq-length", "128",
                           "--max-position-embeddings", "128", "--micro-batch-size", "1",
                           "--global-batch-size", "8", "--project-only",
                           "--projection-out", str(path)])


def test_full_width_digits_name_the_key(tmp_path):
    run = app(["parallel.tp=\uff18"], tmp_path / "home")
    _one_clear_line(run, "parallel.tp", "ASCII digits")


# ---- the user's view -------------------------------------------------------------------
def test_piped_output_keeps_the_title_and_paths_whole(tmp_path):
    run = app(["parallel.cp=1", "parallel.tp=2"], tmp_path / "home")
    first = run.stdout.splitlines()[0]
    assert first.startswith("llama3.1_8b on 8 x h100 | TP2 PP1") and first.endswith("bf16")


def test_does_not_fit_says_the_way_out(tmp_path):
    run = app(["model=llama3_70b", "parallel.tp=8", "parallel.pp=2", "cluster.num_nodes=2",
               "parallel.cp=1", "train.global_batch_size=64", "output=json"],
              tmp_path / "home")
    out = json.loads(run.stdout)
    assert out["fits"] is False
    assert "cheapest saving that fits" in out["suggestion"]


def test_which_calibration_was_applied(tmp_path):
    run = app(["output=json"], tmp_path / "home")
    assert "packaged fit" in json.loads(run.stdout)["calibration"]
    run = app(["output=json", "calibration=null"], tmp_path / "home")
    assert "preset's priors" in json.loads(run.stdout)["calibration"]


def test_numbers_have_no_trailing_zeros():
    from primus_ext.emit.console import fmt
    assert [fmt(714.55), fmt(14.766), fmt(2.0), fmt(1073.4)] == ["714.55", "14.766", "2",
                                                                  "1,073"]


def test_a_single_run_leaves_no_empty_run_directory(tmp_path):
    run = app(["mode=describe"], tmp_path / "home")
    assert run.returncode == 0
    assert not list((tmp_path / "home" / "runs").iterdir())


def test_a_layout_chosen_here_is_said(tmp_path):
    run = app(["parallel.pp=3", "parallel.cp=1", "cluster.gpus_per_node=6",
               "train.global_batch_size=126"], tmp_path / "home")
    assert run.returncode == 0, run.stderr
    assert "layers per virtual stage: [11,11,10]" in run.stdout
    assert "--pipeline-model-parallel-layout" in run.stdout
