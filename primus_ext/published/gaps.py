"""Rules that fill a published row's empty cells: the global batch, the micro-batch, the
recompute setting, an uneven pipeline layout written in the notes. Each rule that fires
writes a note into the row's ``notes``."""
from __future__ import annotations

import dataclasses
import re
from functools import lru_cache

from primus_ext.spec import RunSpec

# Microbatches per pipeline stage assumed when a row gives no global batch and no way to
# derive one (the NeMo / Megatron-Bridge tables run 8-16 microbatches per stage).
DEFAULT_MICROBATCHES_PER_STAGE = 8


# Micro-batch sizes tried for a row that states none (``mbs_if_unstated``).
MBS_CANDIDATES = (1, 2, 4, 8)
MBS_ASSUMED_NOTE = "mbs empty: micro_batch_size=1 assumed"

_LAYOUT_INTS = ("decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers")
_LAYOUT_FLAGS = ("account_for_embedding_in_pipeline_split",
                 "account_for_loss_in_pipeline_split")


def layout_from_notes(text: str) -> dict:
    """Uneven pipeline layout written in a row's notes with Megatron-LM's flag names,
    e.g. 'decoder_first_pipeline_num_layers=3' or 'pipeline_layout=[4,4,3]'."""
    found: dict = {}
    for key in _LAYOUT_INTS:
        m = re.search(rf"{key}\s*[=:]\s*(\d+)", text)
        if m:
            found[key] = int(m.group(1))
    for key in _LAYOUT_FLAGS:
        if key in text:
            found[key] = True
    m = re.search(r"pipeline_layout\s*[=:]\s*\[?\s*(\d+(?:\s*,\s*\d+)*)", text)
    if m:
        found["pipeline_layout"] = tuple(int(v) for v in m.group(1).split(","))
    return found


def derive_gbs(r: _Row, per_step: int, pp: int, world: int, seq: int,
                measured: Measured, notes: list[str]) -> int:
    if measured.step_time_s and measured.tokens_per_s_per_gpu:
        sequences = measured.step_time_s * measured.tokens_per_s_per_gpu * world / seq
        gbs = max(1, round(sequences / per_step)) * per_step
        notes.append(f"gbs empty: {gbs} derived from measured step time x tokens/s/GPU x "
                     f"GPUs / seq_len ({sequences:.1f} sequences, rounded to a multiple "
                     f"of mbs*dp={per_step})")
        return gbs
    m = re.search(r"\bgbs\b[^;]*?\bdefault\s+(\d+)", r.text("notes"), re.IGNORECASE)
    if m and int(m.group(1)) % per_step == 0:
        gbs = int(m.group(1))
        notes.append(f"gbs empty: {gbs}, the default named in the row's notes")
        return gbs
    num_micro = DEFAULT_MICROBATCHES_PER_STAGE * pp
    gbs = per_step * num_micro
    notes.append(f"gbs empty: {gbs} = mbs*dp={per_step} x {num_micro} microbatches "
                 f"(DEFAULT_MICROBATCHES_PER_STAGE={DEFAULT_MICROBATCHES_PER_STAGE} x pp)")
    return gbs


def mbs_if_unstated(spec: RunSpec, notes: list[str]) -> RunSpec:
    """A row whose source states no micro-batch size (nor a recipe default) but states
    its global batch: the fastest of ``MBS_CANDIDATES`` that the global batch allows and
    that fits the device as the row runs, projected with priors only (no calibration,
    so no fit depends on its own choice). A published benchmark runs a tuned
    micro-batch, as ``published/tuned.py`` assumes of a row without a layout; 1 when no
    larger one fits. Replaces the reader's "mbs empty: 1 assumed" note."""
    best, table = _fastest_mbs(spec)
    if MBS_ASSUMED_NOTE in notes:
        notes.remove(MBS_ASSUMED_NOTE)
    tried = ", ".join(f"{m}: {tps:,.0f}" if fits else f"{m}: does not fit"
                      for m, tps, fits in table)
    how = ("the fastest that fits with priors only" if any(f for _, _, f in table)
           else "none of the candidates fits; the smallest kept")
    notes.append(f"mbs empty: micro_batch_size={best.train.micro_batch_size}, {how} "
                 f"(tokens/s/GPU by mbs: {tried})")
    return best


@lru_cache(maxsize=64)
def _fastest_mbs(spec: RunSpec) -> tuple[RunSpec, tuple]:
    from primus_ext.project.estimate import project

    dp = spec.cluster.world_size // spec.parallel.model_parallel_size
    best, best_tps, table = spec, 0.0, []
    for m in MBS_CANDIDATES:
        if spec.train.global_batch_size % (m * dp):
            continue
        try:
            cand = dataclasses.replace(
                spec, train=dataclasses.replace(spec.train, micro_batch_size=m))
            est = project(cand, calibration=None)
        except ValueError:  # a layout rule the candidate breaks (microbatches < pp)
            continue
        tps, fits = est.tokens_per_s_per_gpu, est.memory.fits
        table.append((m, tps, fits))
        if fits and tps > best_tps:
            best, best_tps = cand, tps
    return best, tuple(table)


def recompute_if_needed(spec: RunSpec, notes: list[str], keep: bool = False) -> RunSpec:
    """A row whose recompute cell is empty (a recipe family's default, such as NVIDIA's
    "no recompute for pre-training", is an assumption, not a statement) and that cannot
    fit as assumed must have saved memory: take the cheapest saving that fits
    (``memory/fit_ladder.py``: selective, then the fewest block-recomputed layers, then
    full), as a user would, and say which."""
    from primus_ext.memory.fit_ladder import cheapest_fit

    choice = cheapest_fit(spec)
    if keep:
        # The run's own source states its recompute: keep it, and say what the model
        # makes of it.
        if choice.note:
            notes.append(f"recompute as its source states, although the memory model says "
                         f"it {choice.note.split(';')[0]}")
        return spec
    if choice.note:
        notes.append(f"recompute not stated: {choice.note}")
    return choice.spec
