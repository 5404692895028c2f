"""Issue 15, defects 1, 7 and 9 (CSV): measured values must be finite and positive, run_ids
unique, counts written as integers; validate fails when no row projects; calibrate writes
where the user says (never into the package) and refuses to fit on nothing."""
from __future__ import annotations

import csv
import hashlib
import io
import json

import pytest
from app import app

from primus_ext.project.calibration import DEFAULT_PATH as CALIBRATION
from primus_ext.published import DEFAULT_PATH as RUNS
from primus_ext.published import read_runs

with open(RUNS, newline="") as _f:
    _READER = csv.DictReader(_f)
    HEADER = _READER.fieldnames
    ROWS = {r["run_id"]: r for r in _READER}


def _csv(path, rows):
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=HEADER)
    w.writeheader()
    for r in rows:
        w.writerow(r)
    path.write_text(buf.getvalue())
    return path


def _row(source_id="P001", **cells):
    return {**ROWS[source_id], **cells}


def _digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "-5", "0"])
def test_bad_measured_values_are_row_errors(tmp_path, value):
    path = _csv(tmp_path / "r.csv", [_row("P001", measured_tokens_per_s_per_gpu=value),
                                     _row("P002")])
    runs = {r.run_id: r for r in read_runs(path)}
    err = runs["P001"].error
    assert err and "measured_tokens_per_s_per_gpu" in err and value in err
    assert runs["P002"].error is None
    run = app(["mode=validate", f"runs={path}", "output=json"], tmp_path)
    assert run.returncode == 0, run.stderr
    rows = {r["run_id"]: r for r in json.loads(run.stdout)["rows"]}
    assert rows["P001"]["rel_error"] == "" and rows["P002"]["rel_error"] != ""
    assert json.loads(run.stdout)["summary"][0]["rows"] == 1  # only the good row counts


def test_duplicated_run_id_is_an_error(tmp_path):
    path = _csv(tmp_path / "r.csv", [_row("P001"), _row("P002", run_id="P001")])
    run = app(["mode=validate", f"runs={path}"], tmp_path)
    assert run.returncode == 2
    assert run.error_lines == [f"primus-ext: error: runs={str(path)!r}: run_id 'P001' "
                               "appears twice (lines 2 and 3); each row needs its own run_id"]


@pytest.mark.parametrize("column,value", [("gbs", "2.048e3"), ("layers", "1e3"),
                                          ("num_gpus", "64.0"), ("tp", "inf"),
                                          ("pp", "nan")])
def test_integer_cells_are_written_in_digits(column, value, tmp_path):
    """Exact integer-valued floats are refused as well (one rule for every count)."""
    path = _csv(tmp_path / "r.csv", [_row("P001", **{column: value})])
    (run,) = read_runs(path)
    assert run.spec is None
    assert f"column {column!r}: {value!r} is not an integer" in run.error


def test_validate_fails_when_no_row_projects(tmp_path):
    path = _csv(tmp_path / "r.csv", [_row("P001", gpu="Z80"), _row("P002", layers="x")])
    run = app(["mode=validate", f"runs={path}"], tmp_path)
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert "none of its 2 row(s) could be projected" in run.error_lines[0]
    (tmp_path / "h.csv").write_text("run_id\n")
    run = app(["mode=validate", f"runs={tmp_path / 'h.csv'}"], tmp_path)
    assert run.returncode == 2 and "none of its 0 row(s)" in run.stderr


def test_undecodable_csv_names_the_file(tmp_path):
    path = tmp_path / "latin1.csv"
    path.write_bytes("run_id,model\nP1,caf\xe9\n".encode("latin-1"))
    run = app(["mode=validate", f"runs={path}"], tmp_path)
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert str(path) in run.error_lines[0] and "UTF-8" in run.error_lines[0]


def test_calibrate_on_no_usable_row_is_an_error_and_writes_nothing(tmp_path):
    before = _digest(CALIBRATION)
    (tmp_path / "h.csv").write_text("run_id\n")
    run = app(["mode=calibrate", f"runs={tmp_path / 'h.csv'}", "loso=false"], tmp_path / "home")
    assert run.returncode == 2, run.stderr
    assert "no usable row to fit" in run.error_lines[0]
    path = _csv(tmp_path / "neg.csv", [_row("P001", measured_tokens_per_s_per_gpu="-3")])
    run = app(["mode=calibrate", f"runs={path}", "loso=false"], tmp_path / "home")
    assert run.returncode == 2 and "math domain error" not in run.stderr
    assert "measured_tokens_per_s_per_gpu" in run.error_lines[0]
    assert _digest(CALIBRATION) == before
    assert not (tmp_path / "home" / "calibration.json").exists()


def test_calibrate_writes_under_the_home_and_is_used_by_name(tmp_path):
    before = _digest(CALIBRATION)
    path = _csv(tmp_path / "r.csv", [_row("P001"), _row("P002")])
    home = tmp_path / "home"
    # golden=null: the host-time cases (a minute of fitting) are not what this checks
    run = app(["mode=calibrate", f"runs={path}", "loso=false", "golden=null", "output=json"],
              home)
    assert run.returncode == 0, run.stderr
    written = home / "calibration.json"
    assert json.loads(run.stdout)["calibration"] == str(written)
    assert _digest(CALIBRATION) == before  # the package is never written
    fitted = json.loads(written.read_text())["hardware"]["h100"]
    job = ["model=gpt3_5b", "train.seq_length=2048", "output=json"]  # learned positions: 2048
    default = json.loads(app(["mode=project", *job], home).stdout)
    mine = json.loads(app(["mode=project", *job, f"calibration={written}"], home).stdout)
    assert fitted and mine["step_time_s"] != default["step_time_s"]
    again = json.loads(app(["mode=project", *job], home).stdout)
    assert again["step_time_s"] == default["step_time_s"]  # nothing else changed
