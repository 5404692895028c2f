"""``--pipeline-model-parallel-layout`` strings <-> decoder layers per virtual stage.

Megatron-LM's grammar (megatron/core/transformer/pipeline_parallel_layer_layout.py,
``PipelineParallelLayerLayout.parse_str_to_list``): commas are cosmetic; ``(...)*n``
repeats a group, then ``x*n`` repeats one character; ``|`` separates the virtual stages
in pipeline order (chunk 0 of every stage, then chunk 1, ...); ``E`` is the embedding,
``t`` a decoder layer, ``m`` an MTP layer, ``L`` the loss. The number of stages must be
a multiple of PP (VPP = stages / PP); E must open and L close the layout, once each,
and the ``t`` must count ``--num-layers``.
"""
from __future__ import annotations

import re

_CHARS = "EtmL"


def expand(layout: str) -> list[str]:
    """The layout as one string per virtual stage (repetitions unrolled)."""
    s = layout.replace(",", "").replace(" ", "")
    s = re.sub(r"\(([^)]+)\)\*(\d+)", lambda x: x.group(1) * int(x.group(2)), s)
    s = re.sub(r"(.)\*(\d+)", lambda x: x.group(1) * int(x.group(2)), s)
    stages = s.split("|")
    for st in stages:
        bad = set(st) - set(_CHARS)
        if bad:
            raise ValueError(
                f"--pipeline-model-parallel-layout {layout!r}: invalid layer character(s) "
                f"{''.join(sorted(bad))!r}; known: E (embedding), t (decoder layer), "
                "m (MTP layer), L (loss), '|' between stages, (...)*n and x*n repeats")
    return stages


def layout_counts(layout: str, *, pp: int, num_layers: int, mtp_num_layers: int = 0
                  ) -> tuple[int, ...]:
    """Decoder layers per virtual stage, checked as Megatron-LM checks them."""
    stages = expand(layout)
    flat = "".join(stages)
    name = f"--pipeline-model-parallel-layout {layout!r}"
    if len(stages) % pp:
        raise ValueError(f"{name} has {len(stages)} stages, not a multiple of "
                         f"--pipeline-model-parallel-size {pp}")
    if not flat.startswith("E") or flat.count("E") != 1:
        raise ValueError(f"{name}: the embedding E must open the layout, once")
    if not flat.endswith("L") or flat.count("L") != 1:
        raise ValueError(f"{name}: the loss L must close the layout, once")
    if flat.count("t") != num_layers:
        raise ValueError(f"{name} places {flat.count('t')} decoder layers (t); "
                         f"--num-layers is {num_layers}")
    if flat.count("m") not in (0, mtp_num_layers):
        raise ValueError(f"{name} places {flat.count('m')} MTP layers (m); "
                         f"--mtp-num-layers is {mtp_num_layers}")
    return tuple(st.count("t") for st in stages)


def layout_string(counts: tuple[int, ...], mtp_num_layers: int = 0) -> str:
    """The layout string of decoder layers per virtual stage (E first, MTP layers and L
    in the last stage), with runs of equal middle stages written as ``(t*n|)*k``."""
    parts = []
    for k, n in enumerate(counts):
        s = "t" * n
        if k == 0:
            s = "E" + s
        if k == len(counts) - 1:
            s = s + "m" * mtp_num_layers + "L"
        parts.append(s)
    return "|".join(parts)
