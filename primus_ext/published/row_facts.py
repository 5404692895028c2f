"""Facts about a published run that live in columns: ``compile``, ``tp_comm_overlap``
(torchtitan's AsyncTP, Megatron's TP comm overlap), ``pp_schedule``.

A row states each fact in its own column (``true``/``false``, a schedule name); that
column always wins. A CSV written before the column existed (the format of
``shared/validation/published_runs.csv``) states the fact only in free-text ``notes``:
there the phrase is looked up with its negation ("torch.compile off", "no AsyncTP",
"without torch.compile" read as off), and a note says the fact came from the notes.
"""
from __future__ import annotations

import re

from primus_ext.published.cells import _Row

_TRUE = ("true", "yes", "on", "1", "enabled")
_FALSE = ("false", "no", "off", "0", "disabled", "none")
# Notes phrases per fact (used only when the row has no such column).
_PHRASES = {
    "compile": r"torch\.compile|\bcompile[ds]?\b",
    "tp_comm_overlap": r"async\s*-?\s*tp|\btp\b[\w/]*\s+comm(?:unication)?\s+overlap",
}
_NEGATION_BEFORE = re.compile(r"\b(?:no|not|without|w/o|disabled?|off)\s*$", re.I)
_NEGATION_AFTER = re.compile(r"^\s*(?:[:=]\s*)?(?:off|disabled|false|no|not used)\b", re.I)
# An "on" statement after the phrase ("TP comm overlap on") or none: both mean on.
SCHEDULES = {"1f1b": "1F1B", "interleaved1f1b": "Interleaved1F1B", "gpipe": "GPipe",
             "interleavedzerobubble": "InterleavedZeroBubble",
             "zbvzerobubble": "ZBVZeroBubble"}


def flag(r: _Row, column: str, notes: list[str]) -> bool:
    """The row's boolean fact ``column`` (column first, else its notes)."""
    cell = r.text(column).lower()
    if cell:
        if cell in _TRUE:
            return True
        if cell in _FALSE:
            return False
        raise r.fail(column, f"{cell!r} is not one of {', '.join(_TRUE + _FALSE)}")
    text = r.text("notes")
    for m in re.finditer(_PHRASES[column], text, re.I):
        # The clause the phrase stands in: from the last separator before it to the next.
        start = max(text.rfind(c, 0, m.start()) for c in ",;(+") + 1
        before, after = text[start:m.start()], text[m.end():]
        on = not (_NEGATION_BEFORE.search(before) or _NEGATION_AFTER.search(after))
        notes.append(f"{column}={on} read from the row's notes ({m.group(0)!r}; give the "
                     f"{column!r} column to state it)")
        return on
    return False


def pp_schedule(r: _Row, notes: list[str]) -> str | None:
    """torchtitan's pipeline schedule of the row: the ``pp_schedule`` column, else a
    schedule named in the notes ("Interleaved 1F1B", "1F1B"), else None."""
    cell = r.text("pp_schedule")
    if cell:
        name = SCHEDULES.get(re.sub(r"[\s_-]", "", cell.lower()))
        if name is None:
            raise r.fail("pp_schedule", f"{cell!r} is not one of {', '.join(SCHEDULES.values())}")
        return name
    m = re.search(r"(interleaved\s*1f1b|\b1f1b\b|\bgpipe\b)", r.text("notes"), re.I)
    if m is None:
        return None
    name = SCHEDULES[re.sub(r"\s", "", m.group(1).lower())]
    notes.append(f"pp_schedule={name} read from the row's notes ({m.group(1)!r}; give the "
                 "'pp_schedule' column to state it)")
    return name
