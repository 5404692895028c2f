"""``hydra.sweeper.shards=N``: the tuner's candidates scored by N jobs of the configured
launcher (basic: here, one after another; ``submitit_local`` / ``submitit_slurm``: other
processes or cluster nodes), then merged (``primus_ext.tune.shard``: an exhaustive
search's points, or a guided search's clusters, split over the jobs).

The driver writes the job's RunSpec and TuneSettings to ``<sweep dir>/shards/inputs.pkl``
(the workers must score exactly the driver's space, and the sweep directory is where a
launcher's jobs already meet: submitit keeps its own pickles there); each job reads it,
scores its share and writes ``shards/shard-<i>-of-<N>.jsonl``; the driver reads them all
back and runs the search with every score at hand. The jobs' own directories are
``shards/<job number>`` so they never mix with the validation jobs' ``0``, ``1``, ...
"""
from __future__ import annotations

import logging
import pickle
from pathlib import Path
from typing import Any

from hydra.core.utils import JobStatus
from omegaconf import DictConfig

log = logging.getLogger(__name__)

SHARD_DIR = "shards"
INPUTS = "inputs.pkl"


def score_in_shards(hydra_context, config: DictConfig, spec, settings, count: int,
                    sweep_dir: Path, launcher=None) -> dict | None:
    """The merged shard results by point, or None when the search is not exhaustive.
    ``launcher``: defaults to the configured one, running ``shard_job``."""
    from hydra.core.plugins import Plugins

    from primus_ext.tune.shard import read_shards, shard_plan
    from primus_ext.tune.space import space_of
    from primus_ext.util.files import atomic_write_bytes

    how = shard_plan(space_of(spec, settings), settings)
    if how is None:
        log.warning("primus_tuner: shards=%d unused: one guided search (each candidate "
                    "follows from the last) runs in this process", count)
        return None
    out = sweep_dir / SHARD_DIR
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(out / INPUTS, pickle.dumps((spec, settings)))
    if launcher is None:
        launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=shard_job, config=config)
    jobs = [[f"+primus_shard.index={i}", f"+primus_shard.count={count}",
             f"hydra.sweep.subdir={SHARD_DIR}/${{hydra.job.num}}"] for i in range(count)]
    log.info("primus_tuner: the search's %s split over %d launcher jobs", how, count)
    returns = launcher.launch(jobs, initial_job_idx=0)
    for i, ret in enumerate(returns):
        if ret.status != JobStatus.COMPLETED:
            try:
                ret.return_value
            except Exception as exc:  # noqa: BLE001 - reported with the shard named
                raise ValueError(f"shard {i} of {count} failed: {type(exc).__name__}: "
                                 f"{exc}") from exc
    return read_shards(out, count)


def shard_job(cfg: DictConfig) -> Any:
    """One shard job (the launcher's task function): score, write, return the file."""
    from hydra.core.hydra_config import HydraConfig

    from primus_ext.tune.shard import evaluate_shard

    index, count = int(cfg.primus_shard.index), int(cfg.primus_shard.count)
    out = Path(str(HydraConfig.get().sweep.dir)) / SHARD_DIR
    spec, settings = pickle.loads((out / INPUTS).read_bytes())
    path = evaluate_shard(spec, settings, index, count, out)
    return {"shard": index, "of": count, "file": str(path)}

