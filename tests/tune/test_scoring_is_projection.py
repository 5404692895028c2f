"""The tuner scores a layout exactly as mode=project projects it, with each candidate's
own recipe settings (TP communication overlap at TP > 1 whatever the starting layout),
and a job whose global batch is smaller than its GPU count starts from a legal layout."""
from __future__ import annotations

import pytest

from primus_ext.config import compose_cfg, tune_inputs
from primus_ext.modes.project import run as project_mode
from primus_ext.project.estimate import project
from primus_ext.published import read_runs
from primus_ext.tune.evaluate import Evaluator
from primus_ext.tune.settings import TuneSettings
from primus_ext.tune.space import as_dict, point_of, space_of

# NeMo 24.07 performance summary, Llama 3 70B on 64 H100 (published_runs.csv P012).
JOB = ["model=llama3_70b", "cluster.hardware=h100", "cluster.num_nodes=8",
       "train.global_batch_size=128", "train.seq_length=8192", "train.precision=fp8"]


def _published(run_id):
    return next(r for r in read_runs() if r.run_id == run_id)


def _evaluator(overrides):
    base, data, extra = tune_inputs(overrides)
    settings = TuneSettings.from_dict({**data, "progress": False, "out_dir": None}, **extra)
    return base, Evaluator(space_of(base, settings), settings)


@pytest.mark.parametrize("start", [[], ["parallel.tp=8"]])
def test_published_layout_scores_as_mode_project(start, capsys):
    ref = _published("P012").spec
    p = ref.parallel
    layout = [f"parallel.tp={p.tp}", f"parallel.pp={p.pp}", f"parallel.vpp={p.vpp}",
              f"parallel.cp={p.cp}"]
    base, ev = _evaluator(JOB + start)
    point = ev.space.vary(point_of(base), tp=p.tp, pp=p.pp, vpp=p.vpp, cp=p.cp,
                          micro_batch_size=1, recompute="none",
                          sharding="distributed_optimizer")
    trial = ev.evaluate(point, "reference", enforce_budget=False)
    assert trial.verdict == "ok"
    assert as_dict(trial.point)["tp_comm_overlap"] is True  # the recipe rule at TP 4
    out = project_mode(compose_cfg(JOB + layout + ["output=json"]))
    capsys.readouterr()
    assert trial.metrics["tokens_per_s_per_gpu"] == out["tokens_per_s_per_gpu"]
    assert trial.metrics["step_time_s"] == out["step_time_s"]


def test_tp1_candidate_of_a_tp8_start_has_no_overlap():
    base, ev = _evaluator(JOB + ["parallel.tp=8"])
    d = as_dict(ev.space.vary(point_of(base), tp=1))
    assert d["tp_comm_overlap"] is False and d["sequence_parallel"] is False


def test_stated_overlap_is_kept():
    base, ev = _evaluator(JOB + ["parallel.tp_comm_overlap=false"])
    assert as_dict(ev.space.vary(point_of(base), tp=4))["tp_comm_overlap"] is False


@pytest.mark.parametrize("run_id", ["P012", "P037"])
def test_published_spec_scores_as_its_projection(run_id):
    """The reader's spec as the job: its own layout is a candidate scored as projected."""
    ref = _published(run_id).spec
    space = space_of(ref, TuneSettings(progress=False))
    ev = Evaluator(space, TuneSettings(progress=False))
    trial = ev.evaluate(point_of(ref), "reference", enforce_budget=False)
    est = project(ref)
    assert trial.metrics["tokens_per_s_per_gpu"] == est.tokens_per_s_per_gpu
    assert trial.metrics["step_time_s"] == est.step_time_s


@pytest.mark.parametrize("job,mp", [
    (["model=llama3.1_405b", "cluster.num_nodes=64", "train.global_batch_size=512"], 1),
    (["model=llama3.1_405b", "cluster.num_nodes=64", "train.global_batch_size=256"], 2),
    (["model=nemotron4_340b", "cluster.num_nodes=32", "train.global_batch_size=64"], 4)])
def test_small_global_batch_starts_from_the_smallest_legal_layout(job, mp):
    base, _, _ = tune_inputs(["cluster.hardware=h100"] + job)
    p = base.parallel
    assert p.tp * p.pp * p.cp == mp
    assert base.train.global_batch_size % base.dp == 0


def test_no_layout_is_one_line():
    with pytest.raises(ValueError, match="no layout exists for this job") as err:
        # 512 GPUs, a batch of 3: DP 1 needs TP x PP x CP = 512, and two layers allow
        # at most TP 8 x PP 2 x CP 8.
        tune_inputs(["model=tiny_dense", "model.num_layers=2", "cluster.hardware=h100",
                     "cluster.num_nodes=64", "train.global_batch_size=3"])
    assert "\n" not in str(err.value)


def test_every_published_layout_of_the_job_is_a_candidate():
    from primus_ext.tune.reference import same_job_layouts
    from primus_ext.tune.run import tune
    r = tune(JOB + ["tune.progress=false", "tune.budget.candidates=10"], write=False)
    assert r.reference["run_id"] == "P012" and r.reference["gain"] is not None
    published = same_job_layouts(r.base_spec)
    assert len(published) == 2  # P012 and P030 (NeMo 24.07 and 24.09)
    scored = {t.point for t in r.trials if t.verdict == "ok"}
    for spec in published:  # scored even past the candidate budget
        assert _normal(r, spec) in scored
    assert r.best.metrics["tokens_per_s_per_gpu"] >= max(
        t.metrics["tokens_per_s_per_gpu"] for t in r.trials
        if t.verdict == "ok" and t.source in ("reference", "published"))


def _normal(result, spec):
    from primus_ext.tune.space import space_of
    return space_of(result.base_spec, result.settings).normalize(point_of(spec))
