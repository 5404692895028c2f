"""mode=tune through the primus-ext app: stdout is one JSON object with output=json (the
progress goes to stderr), the recipe directory is printed and complete, and
``primus-ext mode=project $(cat overrides.txt)`` projects the winner's figures."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
JOB = ["model=llama3.1_70b", "cluster.num_nodes=8", "train.global_batch_size=128",
       "train.seq_length=8192", "tune.space.tp=[4,8]", "tune.space.pp=[2,4]",
       "tune.space.cp=[1]", "tune.space.micro_batch_size=[1]"]


def _app(args, home: Path, cwd: Path):
    env = {**os.environ, "PRIMUS_EXT_HOME": str(home), "COLUMNS": "200",
           "MPLBACKEND": "Agg", "PYTHONPATH": str(ROOT)}
    env.pop("HYDRA_FULL_ERROR", None)
    return subprocess.run([sys.executable, "-m", "primus_ext.cli", *args], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=300)


def test_mode_tune_json_then_project_the_overrides(tmp_path):
    out = tmp_path / "recipe"
    run = _app(["mode=tune", *JOB, "output=json", f"tune.out_dir={out}"], tmp_path / "home",
               tmp_path)
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)  # the whole of stdout is one object
    assert "search space" in run.stderr
    assert result["out_dir"] == str(out)
    for name in ("overrides.txt", "recipe.yaml", "megatron_args.sh", "report.md",
                 "trials.jsonl", "timeline.json"):
        assert (out / name).is_file(), name
    overrides = (out / "overrides.txt").read_text().split()
    proj = _app(["mode=project", *overrides, "output=json"], tmp_path / "home", tmp_path)
    assert proj.returncode == 0, proj.stderr
    est = json.loads(proj.stdout)
    best = result["best"]["estimate"]
    assert est["step_time_s"] == best["step_time_s"]
    assert est["tokens_per_s_per_gpu"] == best["tokens_per_s_per_gpu"]
    assert est["breakdown"] == best["breakdown"]


def test_default_out_dir_is_in_the_run_directory(tmp_path):
    run = _app(["mode=tune", *JOB, "tune.budget.candidates=20"], tmp_path / "home", tmp_path)
    assert run.returncode == 0, run.stderr
    line = [x for x in run.stdout.splitlines() if x.startswith("recipe: ")][-1]
    recipe = Path(line.split(": ", 1)[1])
    assert recipe.name == "recipe" and (tmp_path / "home" / "runs") in recipe.parents
    assert (recipe / "overrides.txt").is_file()


def test_bad_axis_is_one_clear_error(tmp_path):
    run = _app(["mode=tune", *JOB, "+tune.space.tpp=[1]"], tmp_path / "home", tmp_path)
    assert run.returncode == 2
    assert "tune.space.tpp is not a search axis" in run.stderr
    assert "Traceback" not in run.stderr
    run = _app(["mode=tune", *JOB, "tune.space.tp=[3]"], tmp_path / "home", tmp_path)
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert "no legal layout" in run.stderr


def test_ctrl_c_leaves_a_valid_journal_and_resume_continues(tmp_path):
    import signal
    import time

    out = tmp_path / "recipe"
    args = ["mode=tune", *JOB[:4], "tune.strategy=exhaustive", f"tune.out_dir={out}"]
    env = {**os.environ, "PRIMUS_EXT_HOME": str(tmp_path / "home"), "PYTHONPATH": str(ROOT)}
    # The child starts as a shell's foreground job does, SIGINT at its default action:
    # a SIGINT the test process inherited as ignored (some runner or library before it
    # in the suite) would otherwise pass to the child, whose Python then installs no
    # KeyboardInterrupt handler and runs to the end.
    proc = subprocess.Popen([sys.executable, "-m", "primus_ext.cli", *args], cwd=tmp_path,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=lambda: signal.signal(
                                signal.SIGINT, signal.SIG_DFL))
    journal = out / "trials.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        # Interrupt early, while the planner and the reference lookup (a nested tune of
        # the published rows without a layout) run: Ctrl-C there must stop this run too.
        if journal.is_file() and journal.read_text().count("\n") > 10:
            break
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "tune.resume=true" in err
    lines = journal.read_text().splitlines()
    records = [json.loads(x) for x in lines]  # every line whole
    assert records[0]["kind"] == "header" and len(records) > 10
    assert (out / "overrides.txt").is_file()
    run = _app([*args[:-2], "tune.strategy=guided", "tune.budget.candidates=200",
                f"tune.out_dir={out}", "tune.resume=true", "output=json"],
               tmp_path / "home", tmp_path)
    assert run.returncode == 0, run.stderr
    after = [json.loads(x) for x in journal.read_text().splitlines()]
    assert after[:len(records)] == records  # appended, never rewritten
    keys = [json.dumps(r["candidate"], sort_keys=True) for r in after if r["kind"] == "trial"]
    assert len(keys) == len(set(keys))


def test_ctrl_c_in_a_nested_tune_reaches_the_caller(monkeypatch):
    """Reading a published row without a layout runs a tuner of its own (the reference
    lookup of every tune does); a Ctrl-C that lands there interrupts the caller instead
    of being spent on the nested search (it was: the outer tune then ran to the end)."""
    import primus_ext.tune.run as run
    from primus_ext.published import read_runs
    from primus_ext.published.tuned import tuned_layout

    class Interrupted:
        interrupted = True
        best_spec = None

    monkeypatch.setattr(run, "tune", lambda *a, **k: Interrupted())
    tuned_layout.cache_clear()
    try:
        with pytest.raises(KeyboardInterrupt):
            read_runs()
    finally:
        tuned_layout.cache_clear()
