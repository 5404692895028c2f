"""trials.jsonl: the append-only journal of a tuning run.

One JSON object per line, written with one ``write`` and flushed per trial, so an
interrupted run (Ctrl-C, a killed job) leaves every finished trial on disk; at worst the
last line is cut short, and ``read_journal`` drops it. The first line is a header naming
the job, so ``tune.resume=true`` refuses a journal of another job.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

from primus_ext.util.values import json_safe

log = logging.getLogger("primus_ext.tune")

SCHEMA_VERSION = 1


def job_key(base_spec, calibration) -> str:
    """What must not change between a run and its resume: the model, the fixed job
    (global batch, sequence) and the base cluster with its hardware constants."""
    t = base_spec.train
    ident = repr((base_spec.model, t.global_batch_size, t.seq_length,
                  base_spec.cluster, str(calibration)))
    return hashlib.sha256(ident.encode()).hexdigest()[:16]


def read_journal(path: str | os.PathLike) -> tuple[dict | None, list[dict], int]:
    """(header, trial records, byte length of the valid prefix) of a journal."""
    path = Path(path)
    header, records, valid = None, [], 0
    with open(path, "rb") as f:
        data = f.read()
    pos = 0
    for raw in data.splitlines(keepends=True):
        if not raw.endswith(b"\n"):
            break  # a line cut short by an interrupted write
        try:
            rec = json.loads(raw)
        except ValueError:
            break
        pos += len(raw)
        valid = pos
        if rec.get("kind") == "header":
            header = rec
        elif rec.get("kind") == "trial":
            records.append(rec)
    return header, records, valid


class Journal:
    """Appends records to ``path``; ``resume`` keeps (and returns) what is there."""

    def __init__(self, path: str | os.PathLike, header: dict, resume: bool = False):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.resumed: list[dict] = []
        header = {"kind": "header", "schema_version": SCHEMA_VERSION, **header}
        if resume and not self.path.is_file():
            log.warning("tune.resume=true: no journal at %s; starting afresh (resume needs "
                        "the tune.out_dir of the interrupted run)", self.path)
        if resume and self.path.is_file():
            old, self.resumed, valid = read_journal(self.path)
            if old is not None and old.get("job_key") != header.get("job_key"):
                raise ValueError(
                    f"tune.resume=true: {self.path} is the journal of another job "
                    f"({old.get('job')!r}); this job is {header.get('job')!r}. Use another "
                    "tune.out_dir or tune.resume=false")
            with open(self.path, "r+b") as f:
                f.truncate(valid)  # drop a half-written last line
            self._f = open(self.path, "a")
            if old is None:
                self._write(header)
        else:
            self._f = open(self.path, "w")
            self._write(header)

    def _write(self, record: dict) -> None:
        self._f.write(json.dumps(json_safe(record)) + "\n")
        self._f.flush()

    def append(self, record: dict) -> None:
        self._write(record)

    def close(self) -> None:
        if not self._f.closed:
            self._f.flush()
            os.fsync(self._f.fileno())
            self._f.close()

    def __enter__(self) -> "Journal":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
