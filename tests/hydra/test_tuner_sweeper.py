"""The tuner as a Hydra Sweeper (hydra/sweeper=primus_tuner): sweep syntax to search
axes, the search in-process, results and recipe in the sweep dir, the top N launched
as jobs through the launcher with their returns beside the projections."""
from __future__ import annotations

import csv
import json

import pytest
import yaml
from hydra.core.override_parser.overrides_parser import OverridesParser

from hydra_plugins.primus_ext_tuner._impl import (AXIS_OF_KEY, TunerSweepError,
                                                  merge_overrides, search_axes)


def _parse(*args):
    return OverridesParser.create().parse_overrides(list(args))


def test_sweep_syntax_becomes_search_axes():
    fixed, axes = search_axes(_parse(
        "model=llama3_70b", "parallel.tp=choice(1,2,4,8)", "parallel.pp=range(1,5)",
        "train.micro_batch_size=1,2", "parallel.cp=2", "tune.space.sharding=[fsdp]",
        "train.recompute_granularity=null,selective", "tune.budget.candidates=50"))
    assert axes == {"tp": [1, 2, 4, 8], "pp": [1, 2, 3, 4], "micro_batch_size": [1, 2],
                    "cp": [2], "sharding": ["fsdp"],
                    "recompute_granularity": [None, "selective"]}
    # a pinned layout key stays a job override (it is also the baseline's value)
    assert fixed == ["model=llama3_70b", "parallel.cp=2", "tune.budget.candidates=50"]


@pytest.mark.parametrize("arg,match", [("model=llama3_8b,llama3_70b", "layout of one job"),
                                       ("parallel.tp=interval(1,8)", "discrete sweep")])
def test_sweeps_the_tuner_cannot_search_are_refused(arg, match):
    with pytest.raises(TunerSweepError, match=match):
        search_axes(_parse(arg))


def test_every_key_maps_to_a_tuner_axis():
    from primus_ext.tune.settings import SPACE_AXES
    assert set(AXIS_OF_KEY.values()) <= set(SPACE_AXES)


def test_merge_keeps_the_candidate_value():
    assert merge_overrides(["model=m", "parallel.tp=1", "output=json"],
                           ["parallel.tp=4", "+train.x=1"]) == [
        "model=m", "output=json", "parallel.tp=4", "+train.x=1"]


E2E = ["-m", "hydra/sweeper=primus_tuner", "model=mixtral_8x22b", "cluster.hardware=mi355x",
       "cluster.num_nodes=8", "train.global_batch_size=128", "train.seq_length=8192",
       "hydra.sweeper.validate_top_k=2",
       # a small budget keeps the test fast; progress bars off for clean logs
       "tune.budget.candidates=80", "tune.progress=false"]


def test_end_to_end_recipe_and_two_validated_jobs(dirs, run_app):
    cwd, home = dirs
    sweep_dir = cwd.parent / "sweep"
    res = run_app(E2E + [f"hydra.sweep.dir={sweep_dir}"], cwd=cwd, home=home)
    assert res.returncode == 0, res.stderr[-3000:]
    for name in ("overrides.txt", "recipe.yaml", "megatron_args.sh", "report.md",
                 "trials.jsonl", "trials.png", "optimization_results.yaml", "summary.csv",
                 "multirun.yaml"):
        assert (sweep_dir / name).is_file(), name
    overrides = (sweep_dir / "overrides.txt").read_text().split()
    assert "model=mixtral_8x22b" in overrides and "cluster.hardware=mi355x" in overrides

    results = yaml.safe_load((sweep_dir / "optimization_results.yaml").read_text())
    assert results["name"] == "primus_tuner"
    assert results["best_evaluated_params"]["model"] == "mixtral_8x22b"
    launched = [t for t in results["top"] if "job" in t]
    assert len(launched) == 2
    for entry in launched:  # a job trains its recipe's line (mode=train): 8 MI355X
        # nodes are not this machine, so it says so instead of re-projecting
        assert entry["job"]["verdict"] == "not run"
        assert entry["job"]["tokens_per_s_per_gpu"] is None
    assert launched[0]["projected"]["tokens_per_s_per_gpu"] == pytest.approx(
        results["best_evaluated_result"])

    with open(sweep_dir / "summary.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2
    assert {r["tuner_rank"] for r in rows} == {"1", "2"}
    for r in rows:
        assert float(r["projected_tokens_per_s_per_gpu"]) > 0
    for job in ("0", "1"):  # one directory per launched job, none per candidate
        rec = json.loads((sweep_dir / job / "result.json").read_text())
        assert rec["result"]["mode"] == "train"
        assert "needs 8 nodes" in rec["result"]["reason"]
    assert sorted(p.name for p in sweep_dir.iterdir() if p.is_dir()) == ["0", "1"]
    assert "launched as jobs" in res.stdout
    assert not list(cwd.iterdir())


def test_axes_restrict_the_search(dirs, run_app):
    cwd, home = dirs
    sweep_dir = cwd.parent / "sweep"
    res = run_app(["-m", "hydra/sweeper=primus_tuner", "model=llama3_8b",
                   "cluster.num_nodes=1", "train.global_batch_size=64",
                   "parallel.tp=choice(2,4)", "parallel.pp=range(1,3)",
                   "train.micro_batch_size=1,2", "tune.progress=false",
                   "tune.budget.candidates=30",
                   f"hydra.sweep.dir={sweep_dir}"], cwd=cwd, home=home)
    assert res.returncode == 0, res.stderr[-3000:]
    seen = set()
    for line in (sweep_dir / "trials.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if rec["kind"] == "trial" and rec["source"] != "baseline":
            c = rec["candidate"]
            seen.add((c["tp"], c["pp"], c["micro_batch_size"]))
    assert seen and seen <= {(t, p, m) for t in (2, 4) for p in (1, 2) for m in (1, 2)}
    assert not (sweep_dir / "summary.csv").exists()  # nothing launched: validate_top_k=0
    assert "the 5 best of" in res.stdout


def test_user_error_is_one_line(dirs, run_app):
    cwd, home = dirs
    res = run_app(["-m", "hydra/sweeper=primus_tuner", "model=llama3_8b,llama3_70b",
                   f"hydra.sweep.dir={cwd.parent / 'sweep'}"], cwd=cwd, home=home)
    assert res.returncode == 1
    assert "searches the layout of one job" in res.stderr
    assert "Traceback" not in res.stderr


def test_sweeping_gpu_kinds_puts_each_row_on_its_own_gpu(dirs, run_app):
    cwd, home = dirs
    sweep_dir = cwd.parent / "sweep"
    res = run_app(["-m", "hydra/sweeper=primus_tuner", "model=llama3_8b",
                   "cluster.num_nodes=1", "cluster.hardware=mi355x,h100",
                   "train.global_batch_size=64", "parallel.tp=1", "parallel.pp=1",
                   "train.micro_batch_size=1,2", "tune.space.sharding=[fsdp]",
                   "train.recompute_granularity=null", "tune.progress=false",
                   f"hydra.sweep.dir={sweep_dir}"], cwd=cwd, home=home)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "GPU (capacity GiB)" in res.stdout
    assert "mi355x x 1 (288)" in res.stdout
    report = (sweep_dir / "report.md").read_text()
    # The baseline lives on the first swept GPU (288 GiB MI355X), not the default H100.
    assert "> 80.0 GiB" not in report.split("## Top")[0]
    assert "| GPU | mem / capacity GiB |" in report
    rows = [line for line in report.split("## Top")[1].splitlines() if line.startswith("| 1 ")]
    assert rows and (" / 288 |" in rows[0] or " / 80 |" in rows[0])
    results = yaml.safe_load((sweep_dir / "optimization_results.yaml").read_text())
    assert {t["hardware"] for t in results["top"]} <= {"mi355x", "h100"}
