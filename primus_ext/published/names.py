"""Names in published-run tables mapped to presets: model names to model presets (with
the aliases source tables use), GPU labels to hardware preset file names."""
from __future__ import annotations

import re

from primus_ext.presets import list_presets

# Names whose normalised form differs from the preset (source table names, releases).
MODEL_ALIASES = {
    "llama3_405b": "llama3.1_405b",  # NVIDIA tables print LLAMA3-405B for Llama 3.1 405B
    "nemotron_8b": "nemotron3_8b",
    "nemotron_22b": "nemotron3_22b",
    "nemotron_15b": "nemotron4_15b",
    "nemotron_340b": "nemotron4_340b",
    "grok_314b": "grok1_314b",
}


def normalize_model_name(name: str) -> str:
    """Lowercase, punctuation to '_', version numbers glued to the family name:
    'Llama-3.1-405B' -> 'llama3.1_405b', 'Grok-1-314B' -> 'grok1_314b'."""
    tokens = [t for t in re.split(r"[^0-9a-z.]+", name.strip().lower()) if t]
    out: list[str] = []
    for tok in tokens:
        tok = tok.strip(".")
        if not tok:
            continue
        if out and re.fullmatch(r"\d+(\.\d+)*", tok) and re.search(r"[a-z]$", out[-1]):
            out[-1] += tok  # a bare version number belongs to the family name
        else:
            out.append(tok)
    return "_".join(out)


def _compact(name: str) -> str:
    return re.sub(r"[^0-9a-z.]", "", name.lower())


def match_model_preset(name: str) -> str | None:
    """The model preset a published model name refers to, or None. A parenthetical
    qualifier of the run ("DeepSeekV3 (w/o MTP)", "(tokendrop)") is not part of the name."""
    presets = list_presets("model")
    norm = normalize_model_name(re.sub(r"\([^)]*\)", " ", name))
    if norm.startswith("meta_"):
        norm = norm[len("meta_"):]
    norm = MODEL_ALIASES.get(norm, norm)
    if norm in presets:
        return norm
    by_compact = {_compact(p): p for p in presets}
    return by_compact.get(_compact(norm))


def hardware_preset_name(gpu: str) -> str:
    """'H100-96GB-500W' -> 'h100_96gb_500w' (the hardware preset's file name)."""
    return "_".join(t for t in re.split(r"[^0-9a-z]+", gpu.strip().lower()) if t)
