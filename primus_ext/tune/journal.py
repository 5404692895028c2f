"""trials.jsonl: the append-only journal of a tuning run.

One JSON object per line, written with one ``write`` and flushed per trial, so an
interrupted run (Ctrl-C, a killed job) leaves every finished trial on disk; at worst the
last line is cut short, and ``read_journal`` drops it. A line that is not a well-formed
record anywhere else (edited by hand, torn by a second writer) is skipped and counted,
and the lines after it are kept; nothing but a last line without its newline is ever
removed. The first line is a header naming the job, so ``tune.resume=true`` refuses a
journal of another job, and a new run refuses an existing journal unless told to
continue it (``tune.resume=true``) or replace it (``tune.overwrite=true``).
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass, field
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


@dataclass
class JournalScan:
    """What a journal holds: its header, the well-formed trial records, the byte length
    up to the last complete line, and the line numbers (1-based) of lines that are not
    a JSON record of this journal (skipped and counted, never deleted)."""
    header: dict | None
    records: list[dict]
    valid_bytes: int
    bad_lines: list[int] = field(default_factory=list)
    record_lines: list[int] = field(default_factory=list)  # line of each trial record


_METRICS = ("step_time_s", "tokens_per_s_per_gpu", "mfu", "peak_memory_bytes")


def _well_formed(rec) -> bool:
    if not isinstance(rec, dict) or not isinstance(rec.get("kind"), str):
        return False
    if rec["kind"] != "trial":
        return True  # the header, and records of other kinds (LLM rounds)
    return isinstance(rec.get("candidate"), dict)


def loadable(rec: dict) -> bool:
    """Whether a trial record holds what a resumed search needs from it."""
    if not (isinstance(rec.get("source"), str) and isinstance(rec.get("verdict"), str)):
        return False
    if rec["verdict"] != "ok":
        return True
    est = rec.get("estimate")
    return isinstance(est, dict) and all(
        isinstance(est.get(k), (int, float)) and not isinstance(est.get(k), bool)
        for k in _METRICS)


def scan_journal(path: str | os.PathLike) -> JournalScan:
    """Read a journal, skipping (and counting) every line that is not a well-formed record:
    a torn line from two writers, a line edited by hand, a record of an unknown shape.
    Records of other kinds (LLM rounds, ...) are kept in the file and not returned."""
    with open(path, "rb") as f:
        data = f.read()
    scan = JournalScan(header=None, records=[], valid_bytes=0)
    pos = 0
    lines = data.split(b"\n")
    for number, raw in enumerate(lines[:-1], 1):  # the last piece has no newline
        pos += len(raw) + 1
        scan.valid_bytes = pos
        if not raw.strip():
            continue
        try:
            rec = json.loads(raw)
        except ValueError:
            rec = None
        if not _well_formed(rec):
            scan.bad_lines.append(number)
        elif rec.get("kind") == "header":
            if scan.header is None:
                scan.header = rec
            else:
                scan.bad_lines.append(number)  # a second header: another job's lines
        elif rec.get("kind") == "trial":
            scan.records.append(rec)
            scan.record_lines.append(number)
    return scan


def read_journal(path: str | os.PathLike) -> tuple[dict | None, list[dict], int]:
    """(header, trial records, byte length up to the last complete line) of a journal;
    see ``scan_journal`` for the lines it skips."""
    scan = scan_journal(path)
    return scan.header, scan.records, scan.valid_bytes


class Journal:
    """Appends records to ``path``; ``resume`` keeps (and returns) what is there."""

    def __init__(self, path: str | os.PathLike, header: dict, resume: bool = False,
                 overwrite: bool = False):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.resumed: list[dict] = []
        self.bad_lines: list[int] = []
        header = {"kind": "header", "schema_version": SCHEMA_VERSION, **header}
        if resume and not self.path.is_file():
            log.warning("tune.resume=true: no journal at %s; starting afresh (resume needs "
                        "the tune.out_dir of the interrupted run)", self.path)
        exists = self.path.is_file() and self.path.stat().st_size > 0
        if exists and not resume and not overwrite:
            raise ValueError(
                f"tune.out_dir={str(self.path.parent)!r} already holds a journal "
                f"({self.path.name}); continue it with tune.resume=true, replace it with "
                "tune.overwrite=true, or choose another tune.out_dir")
        if resume and self.path.is_file():
            scan = scan_journal(self.path)
            old = scan.header
            self.resumed = [r for r in scan.records if loadable(r)]
            if len(self.resumed) < len(scan.records):  # trials a search cannot reuse
                scan.bad_lines = sorted(scan.bad_lines + [
                    n for n, r in zip(scan.record_lines, scan.records) if not loadable(r)])
            self.bad_lines = scan.bad_lines
            if old is not None and old.get("job_key") != header.get("job_key"):
                raise ValueError(
                    f"tune.resume=true: {self.path} is the journal of another job "
                    f"({old.get('job')!r}); this job is {header.get('job')!r}. Use another "
                    "tune.out_dir or tune.resume=false")
            if scan.bad_lines:
                shown = ", ".join(str(n) for n in scan.bad_lines[:10])
                log.warning("%s: skipped %d unreadable line(s) (line %s%s); kept %d trials",
                            self.path, len(scan.bad_lines), shown,
                            ", ..." if len(scan.bad_lines) > 10 else "", len(self.resumed))
            size = self.path.stat().st_size
            if scan.valid_bytes < size:
                # Only a last line without its newline is dropped: a write of this journal
                # cut short by an interrupt (every record ends with a newline).
                with open(self.path, "r+b") as f:
                    f.truncate(scan.valid_bytes)
            self._f = open(self.path, "a")
            if old is None:
                self._write(header)
        else:
            self._f = open(self.path, "w")
            self._write(header)

    def _write(self, record: dict) -> None:
        try:
            self._f.write(json.dumps(json_safe(record)) + "\n")
            self._f.flush()
        except OSError as exc:  # a full disk, a file-size limit: name the file
            raise ValueError(f"tune.out_dir: cannot append to {str(self.path)!r} "
                             f"({exc.strerror or exc}); the trials written so far are "
                             "kept, resume with tune.resume=true") from None

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
