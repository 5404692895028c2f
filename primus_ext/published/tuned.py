"""A published row without a parallel layout (``tp`` and ``pp`` empty, as the strong-
scaling endpoints of Megatron-LM's README): projected with the tuner's best layout for
what the row does state (model, GPUs, global batch, precision, sharding), and the row's
notes say so. The tuner is imported when such a row is read, never when the package
loads (the reader stays free of the core's search machinery otherwise)."""
from __future__ import annotations

from functools import lru_cache

# Candidates the tuner evaluates for a row without a layout (a few seconds per row), and
# the layouts tried in turn as its starting point (the first the row's batch allows).
TUNE_CANDIDATES = 400
PROBE_LAYOUTS = ((1, 1), (8, 1), (8, 2), (8, 3), (8, 4), (8, 6), (8, 8), (8, 12), (8, 16),
                 (8, 24), (8, 32))


@lru_cache(maxsize=32)
def tuned_layout(key: tuple, line: int | None, parse_row):
    """(spec, error, notes, model preset, hardware preset) of the row ``key`` (its
    sorted (column, value) pairs) with the tuner's best layout, searched from the first
    legal layout of PROBE_LAYOUTS with priors only; the row's sharding, CP, EP and
    precision stay as it states them. Cached: a few seconds per row."""
    from primus_ext.tune.run import tune
    from primus_ext.tune.settings import SpaceSettings, TuneSettings

    row = dict(key)
    for tp, pp in PROBE_LAYOUTS:  # any legal layout to start the tuner from
        probe = parse_row({**row, "tp": str(tp), "pp": str(pp),
                           "mbs": row.get("mbs") or "1"}, line)
        if probe.spec is not None:
            break
    found = (probe.model_preset, probe.hardware_preset)
    if probe.spec is None:
        return (None, probe.error, probe.notes, *found)
    spec = probe.spec
    sharding = "fsdp" if spec.parallel.fsdp else "distributed_optimizer"
    fixed = {"sharding": (sharding,), "cp": (spec.parallel.cp,), "ep": (spec.parallel.ep,),
             "precision": (spec.train.precision,)}
    settings = TuneSettings(max_candidates=TUNE_CANDIDATES, max_seconds=None,
                            progress=False, reference=None, calibration=None,
                            space=SpaceSettings(values=fixed))
    result = tune(spec, settings, write=False)
    if result.interrupted:  # Ctrl-C belongs to the caller (a tuner's reference lookup)
        raise KeyboardInterrupt
    best = result.best_spec
    if best is None:
        return (None, f"row {probe.run_id}: columns 'tp', 'pp': empty, and the tuner "
                "found no layout that fits", probe.notes, *found)
    p, t = best.parallel, best.train
    notes = tuple(n for n in probe.notes if not n.startswith("mbs empty")) + (
        f"layout not published (tp, pp empty): the tuner's best layout TP{p.tp} PP{p.pp} "
        f"VP{p.vpp} CP{p.cp} EP{p.ep} mbs{t.micro_batch_size} recompute="
        f"{t.recompute_granularity or 'none'} (priors only, {TUNE_CANDIDATES} candidates; "
        f"sharding {sharding}, cp, ep and precision as the row states them)",)
    return (best, None, notes, *found)
