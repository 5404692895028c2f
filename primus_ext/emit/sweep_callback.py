"""Hydra callback that summarises a multirun sweep into ``<sweep dir>/summary.csv``.

Configured in ``hydra_conf/config.yaml`` under ``hydra.callbacks.sweep_summary``. Each
job's return value is kept as it ends (``on_job_end``) and also written to
``<job dir>/result.json``; at the end of the sweep (``on_multirun_end``) the rows are
ranked, written as CSV and printed as a table. Launchers that run jobs in other
processes (submitit, Ray) call ``on_job_end`` there, so the local end of the sweep reads
the ``result.json`` files back instead.

The primus_tuner sweeper writes its own summary (with the projections beside the
launched jobs' returns); this callback then stays quiet.
"""
from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import Any

from hydra.core.utils import JobReturn, JobStatus
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from primus_ext.emit.sweep_summary import JobResult, print_summary, write_summary_csv
from primus_ext.util.files import atomic_write_text
from primus_ext.util.values import json_safe

RESULT_FILE = "result.json"
SUMMARY_FILE = "summary.csv"
_OWN_SWEEPER = "hydra_plugins.primus_ext_tuner."


def job_value(job_return: JobReturn) -> Any:
    """The job's return value, or a failure record for a job that raised (reading
    ``return_value`` of a failed job raises its exception again)."""
    if job_return.status == JobStatus.COMPLETED:
        return job_return.return_value
    try:
        return job_return.return_value
    except Exception as exc:  # noqa: BLE001 - any job failure becomes a row
        return {"verdict": "failed", "error": f"{type(exc).__name__}: {exc}"}


def _is_multirun(config: DictConfig) -> bool:
    return OmegaConf.select(config, "hydra.mode") == RunMode.MULTIRUN


class SweepSummaryCallback(Callback):
    def __init__(self, filename: str = SUMMARY_FILE, max_rows: int = 40) -> None:
        self.filename = filename
        self.max_rows = max_rows
        self.jobs: list[JobResult] = []

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self.jobs = []

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        if not _is_multirun(config):
            return
        value = job_value(job_return)
        job = JobResult(num=int(config.hydra.job.num),
                        overrides=tuple(job_return.overrides or ()), result=value)
        self.jobs.append(job)
        out_dir = OmegaConf.select(config, "hydra.runtime.output_dir")
        if out_dir:
            record = {"job": job.num, "overrides": list(job.overrides),
                      "result": json_safe(value)}
            atomic_write_text(Path(out_dir) / RESULT_FILE,
                              json.dumps(record, indent=1, default=str) + "\n")

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        target = str(OmegaConf.select(config, "hydra.sweeper._target_", default=""))
        if target.startswith(_OWN_SWEEPER):
            return
        sweep_dir = Path(str(config.hydra.sweep.dir))
        jobs = self.jobs or read_results(sweep_dir)
        if not jobs:
            return
        path = write_summary_csv(jobs, sweep_dir / self.filename)
        # output=json keeps stdout for the jobs' JSON objects.
        out = sys.stderr if OmegaConf.select(config, "output") == "json" else sys.stdout
        with contextlib.redirect_stdout(out):
            print_summary(jobs, f"sweep of {len(jobs)} jobs, ranked by tokens/s/GPU",
                          caption=f"written to {path.resolve()}", max_rows=self.max_rows)


def read_results(sweep_dir: Path) -> list[JobResult]:
    """The ``result.json`` of every job under ``sweep_dir`` (jobs run elsewhere)."""
    jobs = []
    for path in sorted(sweep_dir.rglob(RESULT_FILE)):
        try:
            rec = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        jobs.append(JobResult(num=int(rec.get("job", -1)),
                              overrides=tuple(rec.get("overrides") or ()),
                              result=rec.get("result")))
    return sorted(jobs, key=lambda j: j.num)
