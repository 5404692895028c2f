"""Recompute cells of published rows, read by meaning.

Sources write the activation-recompute setting in their own words: ``full``,
``selective``, ``selective(per-op)``, ``selective (rmsnorm and mla up-projection
recomputed)``, ``full, block, 5 layers``, ``AC``, ``no``. This maps each to megatron-core's
settings (``--recompute-granularity``, ``--recompute-method``, ``--recompute-num-layers``,
``--recompute-modules``; megatron/core/transformer/transformer_config.py) and says how it
read the cell. A cell it cannot map raises a ValueError that names the accepted forms.
"""
from __future__ import annotations

import re

ACCEPTED = ("none (also: no, off, false, 0, disabled)",
            "full (also: AC, activation checkpointing, full AC; 'full, block, N layers' or "
            "'full (N layers)' for the first N layers of each pipeline chunk)",
            "selective (also: selective(per-op), op, SAC; modules in words or megatron-core "
            "names: core_attn / attention, layernorm / rmsnorm / norm, mla_up_proj / "
            "mla up-projection, mlp, moe, moe_act / act, shared_experts)",
            "a list of those modules alone ('norm, act'), read as selective of them")

_NONE = re.compile(r"^(none|no|off|false|0|disabled|no recompute|no ac)$")
_FULL = re.compile(r"^(full|ac|full ac|activation checkpointing|full activation "
                   r"checkpointing|full recompute|true|yes)\b")
_SELECTIVE = re.compile(r"^(selective|sac|op|per-op|op-level)\b")
# Words naming megatron-core recompute modules (transformer_config.py recompute_modules),
# most specific first: "mla up-projection" must not also read as "mlp".
_MODULE_WORDS = (
    (r"mla[\s_-]*up[\s_-]*proj(?:ection)?|up[\s_-]*proj(?:ection)?", "mla_up_proj"),
    (r"shared[\s_-]*experts?", "shared_experts"),
    (r"moe[\s_-]*act(?:ivation)?", "moe_act"),
    (r"\bmoe\b", "moe"),
    # A bare "act": megatron-core's one activation module is the MoE MLP's (moe_act).
    (r"\bact(?:ivations?)?\b", "moe_act"),
    (r"\bmlp\b", "mlp"),
    (r"rms[\s_-]*norm|layer[\s_-]*norm|\bnorms?\b", "layernorm"),
    (r"core[\s_-]*attn|core[\s_-]*attention|\battention\b|\battn\b", "core_attn"),
)


def read_recompute(cell: str) -> tuple[dict, str | None]:
    """TrainSpec keyword arguments for a recompute cell, and a note when the cell was read
    by meaning rather than as one of the plain words full / selective / none."""
    text = " ".join(cell.strip().lower().split())
    if text in ("", "none") or _NONE.match(text):
        return {}, None if text in ("", "none") else f"recompute {cell!r} read as none"
    if _FULL.match(text):
        m = re.search(r"(\d+)\s*layers?", text)
        if m:
            n = int(m.group(1))
            return (dict(recompute_granularity="full", recompute_method="block",
                         recompute_num_layers=n),
                    f"recompute {cell!r} read as full, method block, {n} layers per "
                    "pipeline chunk")
        kwargs = dict(recompute_granularity="full", recompute_method="uniform",
                      recompute_num_layers=1)
        return kwargs, None if text == "full" else f"recompute {cell!r} read as full"
    listed, rest = _modules(text)
    if listed and not re.sub(r"[\s,;/&+()]|\band\b|\brecompute[d]?\b", "", rest):
        # Only module names: the --recompute-modules of a selective recompute.
        return (dict(recompute_granularity="selective", recompute_modules=tuple(listed)),
                f"recompute {cell!r} read as selective of {', '.join(listed)} "
                "(--recompute-modules)")
    if _SELECTIVE.match(text):
        mods, _ = _modules(_SELECTIVE.sub("", text, count=1))
        if not mods:
            note = None if text == "selective" else (
                f"recompute {cell!r} read as selective of core attention (megatron-core's "
                "default module; an op-level policy names no module)")
            return dict(recompute_granularity="selective"), note
        return (dict(recompute_granularity="selective", recompute_modules=tuple(mods)),
                f"recompute {cell!r} read as selective of {', '.join(mods)}")
    raise ValueError(f"{cell!r} is not a recompute setting; accepted: "
                     + "; ".join(ACCEPTED))


def _modules(text: str) -> tuple[list[str], str]:
    """megatron-core recompute modules named in ``text``, and the text left over."""
    mods: list[str] = []
    for pattern, module in _MODULE_WORDS:
        if re.search(pattern, text):
            if module not in mods:
                mods.append(module)
            text = re.sub(pattern, " ", text)
    return mods, text
