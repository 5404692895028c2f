"""Reference layouts: a published run of the same job, projected beside the winner.

``tune.reference=auto`` picks the published run (``data/validation/published_runs.csv``)
whose job equals this one: same model, hardware, GPU count, global batch, sequence length
and precision. ``tune.reference=<run_id>`` forces a row (its own job is then projected,
with a note when it differs). The report shows the reference's measured figure, its
projection under the same projector, and the winner's projected gain over it.
"""
from __future__ import annotations

from dataclasses import dataclass

from primus_ext.project.validate import recompute_inferred
from primus_ext.spec import RunSpec


@dataclass(frozen=True, kw_only=True, slots=True)
class Reference:
    run_id: str
    spec: RunSpec
    measured_tokens_per_s_per_gpu: float | None
    source: str
    same_job: bool
    notes: tuple[str, ...] = ()
    recompute_inferred: bool = False  # the source left recompute unstated


def same_job(a: RunSpec, b: RunSpec) -> bool:
    return (a.model == b.model and a.cluster.hardware.name == b.cluster.hardware.name
            and a.world_size == b.world_size
            and a.train.global_batch_size == b.train.global_batch_size
            and a.train.seq_length == b.train.seq_length
            and a.train.precision == b.train.precision)


def _int(v) -> int | None:
    try:
        return int(float(v))
    except (TypeError, ValueError):
        return None


def published_runs(base: RunSpec | None = None, run_id: str | None = None) -> list:
    """The published runs of the project's data (the public set and the MoE runs) that
    may be ``base``'s job (same GPU count, global batch and sequence in the CSV) or are
    ``run_id``; all of them when neither is given. Only those rows are read into specs
    (reading all of them takes seconds)."""
    import csv

    from primus_ext.published import DEFAULT_PATH, read_runs
    from primus_ext.published.reader import parse_row
    if base is None and run_id is None:
        return read_runs()
    want = None if base is None else (base.world_size, base.train.global_batch_size,
                                      base.train.seq_length)
    out = []
    with open(DEFAULT_PATH, newline="", encoding="utf-8-sig") as f:
        reader = csv.DictReader(f)
        for row in reader:
            rid = (row.get("run_id") or "").strip()
            key = (_int(row.get("num_gpus")), _int(row.get("gbs")),
                   _int(row.get("seq_len")))
            # A cell left empty (the reader derives it) matches anything.
            maybe = want is not None and all(k is None or k == w
                                             for k, w in zip(key, want))
            if rid == run_id or maybe:
                out.append(parse_row(row, line=reader.line_num))
    return out


def same_job_layouts(base: RunSpec, runs=None) -> list[RunSpec]:
    """The specs of every published run of ``base``'s job (each a tuner candidate)."""
    runs = published_runs(base) if runs is None else runs
    return [r.spec for r in runs if r.spec is not None and same_job(r.spec, base)]


def find_reference(base: RunSpec, which: str | None, runs=None) -> Reference | None:
    """The reference run for ``base``: None, 'auto' or a run_id."""
    if which is None or str(which).lower() in ("none", "null", "false", ""):
        return None
    if runs is None:
        runs = published_runs(base, None if str(which).lower() == "auto" else str(which))
    if str(which).lower() == "auto":
        hits = [r for r in runs if r.spec is not None and same_job(r.spec, base)]
        if not hits:
            return None
        run = hits[0]
    else:
        by_id = {r.run_id: r for r in runs}
        run = by_id.get(str(which))
        if run is None:
            raise ValueError(f"tune.reference={which!r} is not a run_id of the published "
                             "runs (data/validation/published_runs.csv)")
        if run.spec is None:
            raise ValueError(f"tune.reference={which!r}: that row has no usable layout "
                             f"({run.error})")
    return Reference(run_id=run.run_id, spec=run.spec,
                     measured_tokens_per_s_per_gpu=run.measured.tokens_per_s_per_gpu,
                     source=run.source, same_job=same_job(run.spec, base),
                     notes=tuple(run.notes), recompute_inferred=recompute_inferred(run))
