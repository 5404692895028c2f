"""The tuner sweeper's shard jobs (hydra_plugins/primus_ext_tuner/_shards.py) with a
stand-in launcher: a failed or silent shard is named, a guided search launches none."""
from __future__ import annotations

import pytest
from hydra.core.utils import JobReturn, JobStatus

from hydra_plugins.primus_ext_tuner._shards import score_in_shards
from primus_ext.presets import hardware_preset, model_preset
from primus_ext.spec import ClusterSpec, ModelSpec, ParallelSpec, RunSpec, TrainSpec
from primus_ext.tune.settings import TuneSettings

SPEC = RunSpec(model=ModelSpec(**model_preset("llama3.1_8b")), parallel=ParallelSpec(),
               train=TrainSpec(seq_length=8192, global_batch_size=64),
               cluster=ClusterSpec(hardware=hardware_preset("h100"), num_nodes=1))
SPACE = {"tp": [1, 2], "pp": [1, 2], "cp": [1], "micro_batch_size": [1]}


class Launcher:
    """Returns the given job returns; records what it was asked to launch."""

    def __init__(self, returns):
        self.returns, self.jobs = returns, None

    def launch(self, jobs, initial_job_idx):
        self.jobs = jobs
        return self.returns


def _settings(**kw):
    return TuneSettings.from_dict({"progress": False, "reference": None, "space": SPACE,
                                   **kw})


def test_a_failed_shard_is_named(tmp_path):
    launcher = Launcher([JobReturn(status=JobStatus.COMPLETED, _return_value={}),
                         JobReturn(status=JobStatus.FAILED,
                                   _return_value=RuntimeError("node lost"))])
    with pytest.raises(ValueError, match="shard 1 of 2 failed: RuntimeError: node lost"):
        score_in_shards(None, None, SPEC, _settings(), 2, tmp_path, launcher=launcher)
    assert [j[:2] for j in launcher.jobs] == [
        ["+primus_shard.index=0", "+primus_shard.count=2"],
        ["+primus_shard.index=1", "+primus_shard.count=2"]]
    assert (tmp_path / "shards" / "inputs.pkl").is_file()


def test_a_shard_that_wrote_nothing_is_named(tmp_path):
    launcher = Launcher([JobReturn(status=JobStatus.COMPLETED, _return_value={})] * 2)
    with pytest.raises(ValueError, match="shard 0 of 2 wrote no results"):
        score_in_shards(None, None, SPEC, _settings(), 2, tmp_path, launcher=launcher)


def test_guided_search_launches_no_shard(tmp_path):
    launcher = Launcher(None)
    assert score_in_shards(None, None, SPEC, _settings(strategy="guided"), 2, tmp_path,
                           launcher=launcher) is None
    assert launcher.jobs is None
