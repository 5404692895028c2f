"""Build ``primus_ext/data/validation/bridge_moe_configs.json`` from a Megatron-Bridge clone.

Megatron-Bridge publishes one pre-training table per NeMo container release
(``docs/performance-summary.md``, older ones moved to ``performance-summary-archive.md``),
each produced by that release's ``scripts/performance`` recipes. For every release whose
recipes are the ``WorkloadBaseConfig`` presets (25.11 to 26.06: ``scripts/performance/
configs/<family>/*workload_base_configs.py``), this script reads the presets at the commit
that first published the release's table (``git log -S '## <release> NeMo Container'``)
and keeps, for every MoE preset on GB200, B200 and H100, what the projection needs: the
layout, the flex dispatcher backend, the EP all-to-all overlap, the CUDA graph scope and
the recompute modules. The presets are plain module-level dataclass instances; the file is
executed with a stand-in ``WorkloadBaseConfig`` that records every keyword (nothing else of
the clone is imported).

Usage: python scripts/bridge_moe_configs.py /path/to/Megatron-Bridge [--write]
(without --write: print the table). The output names the clone's commit per release.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import subprocess
import sys
import tempfile
import types

OUT = os.path.join(os.path.dirname(__file__), "..", "primus_ext", "data", "validation",
                   "bridge_moe_configs.json")
RELEASES = ("25.11", "26.02", "26.02.01", "26.04", "26.04.01", "26.06")
DOCS = "docs/performance-summary.md"
FAMILIES = ("qwen3", "qwen", "gpt_oss", "deepseek", "kimi")
MODELS = {"QWEN3_30B_A3B": "qwen3_30b_a3b", "QWEN3_235B_A22B": "qwen3_235b_a22b",
          "GPT_OSS_120B": "gpt_oss_120b", "DEEPSEEK_V3": "deepseek_v3", "KIMI_K2": "kimi_k2"}
NAME = re.compile(r"^(?P<model>" + "|".join(MODELS) + r")_(?:PRETRAIN_CONFIG_)?"
                  r"(?P<gpu>GB200|B200|H100)(?:_(?P<prec>BF16|FP8_CS|FP8_MX|FP8_SC|NVFP4))?"
                  r"(?:_(?P<variant>V\d+))?(?:_BASE_CONFIG)?$")
KEEP = ("num_gpus", "tensor_model_parallel_size", "pipeline_model_parallel_size",
        "context_parallel_size", "virtual_pipeline_model_parallel_size",
        "expert_model_parallel_size", "global_batch_size", "micro_batch_size",
        "use_megatron_fsdp", "cuda_graph_impl", "cuda_graph_scope", "recompute_modules",
        "moe_flex_dispatcher_backend", "moe_a2a_overlap", "cpu_offloading_num_layers")


def _git(repo: str, *args: str) -> str:
    return subprocess.run(["git", "-C", repo, *args], capture_output=True, text=True,
                          check=False).stdout


def release_commit(repo: str, release: str) -> str | None:
    """The oldest commit whose docs add the release's section header."""
    out = _git(repo, "log", "--format=%H", "-S", f"## {release} NeMo Container", "--", DOCS)
    commits = out.split()
    return commits[-1] if commits else None


class _Preset:
    """Stand-in for ``utils.utils.WorkloadBaseConfig``: keeps every keyword."""

    def __init__(self, **kw):
        self.values = dict(kw)


def _replace(obj: _Preset, **kw) -> _Preset:
    return _Preset(**{**obj.values, **kw})


def _defaults(repo: str, commit: str) -> dict:
    """The dataclass defaults of the release's WorkloadBaseConfig."""
    src = _git(repo, "show", f"{commit}:scripts/performance/utils/utils.py")
    m = re.search(r"class WorkloadBaseConfig:(.*?)\n(?:    @|\S)", src, re.S)
    out = {}
    for line in (m.group(1) if m else "").splitlines():
        f = re.match(r"\s+(\w+):\s*[^=]+=\s*(.+?)\s*(#.*)?$", line)
        if f:
            try:
                out[f.group(1)] = eval(f.group(2), {"field": dataclasses.field})  # noqa: S307
            except Exception:  # a default we do not need (factory, name)
                continue
    return out


def read_presets(repo: str, commit: str) -> dict:
    utils = types.ModuleType("utils.utils")
    utils.WorkloadBaseConfig = _Preset
    pkg = types.ModuleType("utils")
    pkg.utils = utils
    saved = {k: sys.modules.get(k) for k in ("utils", "utils.utils")}
    sys.modules["utils"], sys.modules["utils.utils"] = pkg, utils
    defaults = _defaults(repo, commit)
    presets = {}
    try:
        for fam in FAMILIES:
            tree = _git(repo, "ls-tree", "--name-only", commit,
                        f"scripts/performance/configs/{fam}/")
            for path in tree.split():
                if not path.endswith("workload_base_configs.py"):
                    continue
                src = _git(repo, "show", f"{commit}:{path}")
                src = src.replace("from dataclasses import replace", "")
                scope = {"__name__": "presets", "replace": _replace}
                exec(compile(src, path, "exec"), scope)  # noqa: S102
                for name, obj in scope.items():
                    m = NAME.match(name)
                    if not isinstance(obj, _Preset) or not m:
                        continue
                    values = {**defaults, **obj.values}
                    presets[name] = {
                        "file": path, "model": MODELS[m.group("model")],
                        "gpu": m.group("gpu"), "precision": (m.group("prec") or "").lower(),
                        "variant": (m.group("variant") or "").lower(),
                        **{k: values[k] for k in KEEP if values.get(k) is not None}}
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v
    return presets


_FUNC = re.compile(r"^def (?P<model>" + "|".join(m.lower() for m in MODELS) +
                   r")_pretrain_config_(?P<gpu>gb200|b200|h100)\(", re.M)


def read_pretrain(repo: str, commit: str) -> dict:
    """What each ``<model>_pretrain_config_<gpu>`` function of the release's
    ``*_llm_pretrain.py`` sets beyond the preset: the token dispatcher type and the TP
    communication overlap (``CommOverlapConfig(tp_comm_overlap=...)``)."""
    out = {}
    for fam in FAMILIES:
        tree = _git(repo, "ls-tree", "--name-only", commit, f"scripts/performance/configs/{fam}/")
        for path in tree.split():
            if not path.endswith("_llm_pretrain.py"):
                continue
            src = _git(repo, "show", f"{commit}:{path}")
            heads = list(_FUNC.finditer(src))
            for i, m in enumerate(heads):
                end = heads[i + 1].start() if i + 1 < len(heads) else len(src)
                nxt = re.search(r"^def ", src[m.end():end], re.M)
                body = src[m.end():m.end() + nxt.start()] if nxt else src[m.end():end]
                got = {"file": path}
                d = re.search(r"moe_token_dispatcher_type\s*=\s*[\"'](\w+)[\"']", body)
                if d:
                    got["moe_token_dispatcher_type"] = d.group(1)
                t = re.search(r"CommOverlapConfig\(\s*tp_comm_overlap\s*=\s*(True|False)", body)
                if t:
                    got["tp_comm_overlap"] = t.group(1) == "True"
                out[f"{m.group('model')}:{m.group('gpu').upper()}"] = got
    return out


def build(repo: str) -> dict:
    head = _git(repo, "rev-parse", "HEAD").strip()
    table = {"source": "github.com/NVIDIA-NeMo/Megatron-Bridge", "read_at": head,
             "releases": {}}
    for rel in RELEASES:
        commit = release_commit(repo, rel)
        if commit is None:
            continue
        table["releases"][rel] = {"commit": commit, "presets": read_presets(repo, commit),
                                  "pretrain": read_pretrain(repo, commit)}
    return table


def write_atomic(path: str, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".bridge_moe.")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("repo", help="a Megatron-Bridge git clone (full history)")
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    table = build(args.repo)
    text = json.dumps(table, indent=0, sort_keys=True) + "\n"
    if args.write:
        write_atomic(os.path.abspath(OUT), text)
    for rel, r in table["releases"].items():
        print(rel, r["commit"][:9], len(r["presets"]), "MoE presets")
    return 0


if __name__ == "__main__":
    sys.exit(main())
