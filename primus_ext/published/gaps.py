"""Rules that fill a published row's empty cells: the global batch, the recompute
setting, an uneven pipeline layout written in the notes. Each rule that fires writes a
note into the row's ``notes``."""
from __future__ import annotations

import re

from primus_ext.spec import RunSpec

# Microbatches per pipeline stage assumed when a row gives no global batch and no way to
# derive one (the NeMo / Megatron-Bridge tables run 8-16 microbatches per stage).
DEFAULT_MICROBATCHES_PER_STAGE = 8


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


def recompute_if_needed(spec: RunSpec, notes: list[str], keep: bool = False) -> RunSpec:
    """A row whose recompute cell is empty (a recipe family's default, such as NVIDIA's
    "no recompute for pre-training", is an assumption, not a statement) and that cannot
    fit as assumed must have saved memory: take the cheapest saving that fits (``memory/fit_ladder.py``: selective, then the
    fewest block-recomputed layers, then full), as a user would, and say which."""
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
