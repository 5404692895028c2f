"""Megatron-Bridge's performance presets per table release, read from
``data/validation/bridge_moe_configs.json`` (built by ``scripts/bridge_moe_configs.py``
from the Megatron-Bridge commit that published each release's table).

A MegatronBridge-perf row without a hand-read entry in ``bridge_moe.ENTRIES`` takes the
preset its release's scripts would have run: the row's model, GPU and precision
(``FP8_CS``, ``FP8_MX``, ``BF16``; a preset without a precision in its name serves every
precision), and among the variants the one whose layout is the row's (TP, PP, VP, EP,
MBS; the global batch scales with the GPU count, ``gbs_scaling_factor``), else the
scripts' default variant (``argument_parser.py --config_variant``: "Defaults to 'v2'
('v1' if 'v2' doesn't exist)"). A layout no preset of the release has takes the preset
of the nearest release that has it.
"""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

PATH = Path(__file__).resolve().parent.parent / "data" / "validation" / "bridge_moe_configs.json"
_LAYOUT = (("tp", "tensor_model_parallel_size", 1), ("pp", "pipeline_model_parallel_size", 1),
           ("vpp", "virtual_pipeline_model_parallel_size", 1),
           ("ep", "expert_model_parallel_size", 1), ("mbs", "micro_batch_size", 1))


@lru_cache(maxsize=1)
def _table() -> dict:
    with open(PATH) as f:
        return json.load(f)


def _release_key(release: str) -> tuple[int, ...]:
    """'26.02.01' -> (26, 2, 1): container releases in time order."""
    return tuple(int(x) for x in release.split("."))


def _kinds(kind: str) -> tuple[str, ...]:
    return {"bf16": ("bf16", ""), "fp8_cs": ("fp8_cs", ""), "fp8_mx": ("fp8_mx", "")}.get(
        kind, ("",))


def layout_mismatch(f, preset: dict) -> list[str]:
    """The layout fields where the preset differs from the row (``f``: RowFacts)."""
    out = []
    for attr, key, default in _LAYOUT:
        row = getattr(f, attr, None)
        want = preset.get(key, default)
        if row in (None, 0) or want is None:
            continue
        if int(row) != int(want):
            out.append(f"{attr.upper()} {want}")
    return out


def _candidates(rel: dict, f, kind: str) -> dict:
    gpu, model = f.gpu.upper(), f.model_preset or ""
    for prec in _kinds(kind):
        cands = {name: p for name, p in rel["presets"].items()
                 if p["model"] == model and p["gpu"] == gpu and p["precision"] == prec}
        if cands:
            return cands
    return {}


def _exact(cands: dict, f) -> str | None:
    exact = [n for n, p in cands.items() if not layout_mismatch(f, p)]
    return sorted(exact, key=lambda n: cands[n].get("variant", ""))[-1] if exact else None


def find_preset(release: str, f, kind: str) -> tuple[str, str, str, dict] | None:
    """(release read, commit, preset name, preset) for the row, or None when the release
    or the model/GPU has no preset. A table row whose layout no preset of its release
    has was run with an older or newer recipe: the preset of the nearest release (the
    earlier one first) with exactly the row's layout is taken, else the release's
    default variant."""
    releases = _table()["releases"]
    if release not in releases:
        return None
    order = sorted(releases, key=_release_key)
    at = order.index(release)
    for i in sorted(range(len(order)), key=lambda i: (abs(i - at), i)):
        other = order[i]
        cands = _candidates(releases[other], f, kind)
        name = _exact(cands, f)
        if name:
            return other, releases[other]["commit"], name, cands[name]
    cands = _candidates(releases[release], f, kind)
    if not cands:
        return None
    by_variant = {p.get("variant", ""): n for n, p in cands.items()}
    name = by_variant.get("v2") or by_variant.get("v1") or sorted(cands)[0]
    return release, releases[release]["commit"], name, cands[name]


def preset_entry(release: str, f, kind: str, entry_type):
    """A ``bridge_moe.MoeEntry`` built from the release's preset, or None."""
    found = find_preset(release, f, kind)
    if found is None:
        return None
    read, commit, name, p = found
    fn = _table()["releases"][read]["pretrain"].get(f"{p['model']}:{p['gpu']}", {})
    impl = p.get("cuda_graph_impl")
    if impl == "transformer_engine":
        graphs = tuple(p.get("cuda_graph_scope") or ())
    elif impl == "full_iteration":
        graphs = ("full_iteration",)
    else:
        graphs = ()
    rc = p.get("recompute_modules")
    backend = p.get("moe_flex_dispatcher_backend")
    # The model's pretrain function sets the dispatcher type after the backend (Qwen3
    # 235B-A22B on H100 and B200: alltoall); a flex type with no backend named runs
    # megatron-core's default backend (TransformerConfig.moe_flex_dispatcher_backend).
    dispatcher = fn.get("moe_token_dispatcher_type") or ("flex" if backend else "alltoall")
    if dispatcher == "flex" and not backend:
        backend = "deepep"
    path = f"{commit[:9]} {p['file']} {name}"
    if read != release:
        path += f" (release {read}'s preset: the one with the table's layout)"
    if fn:
        path += f"; {fn['file']} {p['model']}_pretrain_config_{p['gpu'].lower()}"
    return entry_type(
        path, dispatcher=dispatcher, backend=backend if dispatcher == "flex" else None,
        a2a_overlap=bool(p.get("moe_a2a_overlap")), graphs=graphs,
        recompute=tuple(rc) if rc is not None else None,
        tp_comm_overlap=fn.get("tp_comm_overlap"), layout=", ".join(layout_mismatch(f, p)))
