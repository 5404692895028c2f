"""The memory model's allocated peak against Megatron-LM's GPU logs: a docs/memory.md section.

Renders ``primus_ext/published/golden_memory.py`` (every golden case: the last stage's
``allocated_peak_bytes`` beside ``mem-max-allocated-bytes``, the path it exercises, the
summary figures) and, with ``--write``, puts it into docs/memory.md between its markers
(the rest of the page is scripts/memory_table.py's, which keeps this section when it
rewrites the page). Pure: no torch, seconds.

Usage: python scripts/golden_memory.py [--write]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

BEGIN = "<!-- golden-memory:begin (scripts/golden_memory.py) -->"
END = "<!-- golden-memory:end -->"
DOC = ROOT / "docs" / "memory.md"


def section() -> str:
    from primus_ext.published.golden_memory import golden_rows, render
    return f"{BEGIN}\n{render(golden_rows())}{END}\n"


def with_section(page: str, text: str) -> str:
    """``page`` with its golden section replaced by ``text`` (appended if absent)."""
    if BEGIN in page and END in page:
        head, rest = page.split(BEGIN, 1)
        tail = rest.split(END, 1)[1].lstrip("\n")
        return head + text + ("\n" + tail if tail else "")
    return page.rstrip("\n") + "\n\n" + text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="update docs/memory.md")
    args = ap.parse_args()
    text = section()
    print(text)
    if args.write:
        DOC.write_text(with_section(DOC.read_text() if DOC.exists() else "", text))
        print(f"wrote {DOC}")


if __name__ == "__main__":
    main()
