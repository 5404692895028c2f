"""Sweeps and the tuner sweeper through Hydra's submitit launcher (``submitit_local``:
every job in its own process, as ``submitit_slurm`` runs them on cluster nodes) give
what the basic launcher gives in this process: the same summary.csv, the same recipe and
journal, also when the tuner's candidates are scored by shard jobs.

Tiny sweeps: each submitit job is a new Python process."""
from __future__ import annotations

import re

import pytest

pytest.importorskip("hydra_plugins.hydra_submitit_launcher")

SUBMITIT = ["hydra/launcher=submitit_local", "hydra.launcher.timeout_min=10"]
SWEEP = ["-m", "model=llama3_8b", "parallel.tp=1,2", "cluster.num_nodes=1",
         "train.global_batch_size=64"]
TUNER = ["-m", "hydra/sweeper=primus_tuner", "model=llama3_8b", "cluster.num_nodes=1",
         "train.global_batch_size=64", "parallel.tp=choice(1,2,4)", "parallel.pp=1,2",
         "parallel.cp=1", "train.micro_batch_size=1,2", "tune.progress=false",
         "hydra.sweeper.validate_top_k=1"]
RECIPE = ("overrides.txt", "recipe.yaml", "megatron_args.sh", "trials.jsonl",
          "summary.csv")


def _run(run_app, dirs, args, name):
    cwd, home = dirs
    sweep_dir = cwd.parent / name
    res = run_app(args + [f"hydra.sweep.dir={sweep_dir}"], cwd=cwd, home=home)
    assert res.returncode == 0, res.stderr[-3000:]
    return sweep_dir


def test_sweep_summary_is_the_basic_launchers(dirs, run_app):
    basic = _run(run_app, dirs, SWEEP, "basic")
    sub = _run(run_app, dirs, SWEEP + SUBMITIT, "submitit")
    assert (sub / "summary.csv").read_text() == (basic / "summary.csv").read_text()
    assert (sub / ".submitit").is_dir()  # the jobs ran through submitit
    assert len((sub / "summary.csv").read_text().splitlines()) == 3


def _report(path):  # the search's wall time is the one figure that may differ
    return re.sub(r"in [0-9.]+ s \(budget", "in - s (budget", path.read_text())


def test_tuner_sweeper_recipe_is_the_basic_launchers(dirs, run_app):
    basic = _run(run_app, dirs, TUNER, "basic")
    sub = _run(run_app, dirs, TUNER + SUBMITIT + ["hydra.sweeper.shards=2"], "sharded")
    for name in RECIPE:
        assert (sub / name).read_text() == (basic / name).read_text(), name
    assert _report(sub / "report.md") == _report(basic / "report.md")
    # two shard jobs scored the candidates, one validation job ran the winner
    shards = sorted(p.name for p in (sub / "shards").glob("shard-*.jsonl"))
    assert shards == ["shard-0000-of-0002.jsonl", "shard-0001-of-0002.jsonl"]
    assert (sub / "0" / "result.json").is_file() and not (basic / "shards").exists()


def test_readme_slurm_example_composes(dirs, run_app):
    """The README's SLURM lines compose (no SLURM here: the configs only)."""
    cwd, home = dirs
    res = run_app(["hydra/launcher=submitit_slurm", "hydra.launcher.partition=cpu",
                   "hydra.launcher.cpus_per_task=1", "hydra.launcher.timeout_min=10",
                   "hydra/sweeper=primus_tuner", "hydra.sweeper.shards=8",
                   "hydra.sweeper.validate_top_k=2", "model=mixtral_8x22b",
                   "--cfg", "hydra"], cwd=cwd, home=home)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "hydra_submitit_launcher.submitit_launcher.SlurmLauncher" in res.stdout
    assert "partition: cpu" in res.stdout and "shards: 8" in res.stdout
