"""Megatron-LM's functional-test golden values on DGX H100, as one data file.

Megatron-LM's CI runs each functional test with the real ``pretrain_gpt.py`` (or
``pretrain_mamba.py``, ...) flags of ``tests/functional_tests/test_cases/<family>/<case>/
model_config.yaml`` and records, per iteration, the series of
``golden_values_dev_dgx_h100.json``: ``iteration-time`` (seconds, as Megatron-LM's
training log prints it), ``mem-max-allocated-bytes`` (``torch.cuda.max_memory_allocated``
on the rank that writes the log: the last one), ``mem-allocated-bytes`` (allocated when
the log line is written, after the step) and others. The node and GPU counts come
from the recipes ``tests/test_utils/recipes/h100/*.yaml`` that list the case for the
``dgx_h100`` platform.

This script reads those files from a Megatron-LM git directory at one commit (``git show``;
no work tree needed) and writes ``tests/data/megatron_golden/h100.json``: per case its
family, test type, launch script, the argv exactly as the CI's ``_run_training.sh``
builds it from ``MODEL_ARGS`` (``true`` -> the bare flag, ``[a, b]`` -> ``a b``, empty
values dropped; ``${VAR}`` placeholders kept), ``ENV_VARS``, nodes and GPUs per node,
the median iteration time after warmup, the allocated peak (its largest value and its
value at the second logged iteration) and the bytes allocated after the last step.

Usage: python scripts/golden_dataset.py --repo PATH_TO_MEGATRON_LM_GIT [--commit REV]
       [--out tests/data/megatron_golden/h100.json]
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "data" / "megatron_golden" / "h100.json"
CASES = "tests/functional_tests/test_cases"
RECIPES = "tests/test_utils/recipes/h100"
GOLDEN = "golden_values_dev_dgx_h100.json"
# Iterations dropped from the start of the series: the first steps build the CUDA
# caching allocator's pools, JIT-compile fused kernels and run cuDNN/cuBLAS heuristics.
WARMUP_ITERS = 3
# Training scripts per model family (the recipes' TRAINING_SCRIPT_PATH).
SCRIPTS = {"gpt": "pretrain_gpt.py", "moe": "pretrain_gpt.py", "mixtral": "pretrain_gpt.py",
           "hybrid": "pretrain_mamba.py", "bert": "pretrain_bert.py", "t5": "pretrain_t5.py",
           "multimodal-llava": "pretrain_vlm.py", "mimo": "pretrain_mimo.py"}


def _git(repo: str, *args: str) -> str:
    return subprocess.run(["git", "--git-dir", repo, *args], check=True,
                          capture_output=True, text=True).stdout


def _show(repo: str, rev: str, path: str) -> str | None:
    r = subprocess.run(["git", "--git-dir", repo, "show", f"{rev}:{path}"],
                       capture_output=True, text=True)
    return r.stdout if r.returncode == 0 else None


def argv_from_model_args(args: dict) -> list[str]:
    """The argv ``_run_training.sh`` builds from MODEL_ARGS (its yq + bash loop)."""
    out: list[str] = []
    for key, value in args.items():
        if value is None or value == "":
            continue
        if value is True:
            out.append(str(key))
            continue
        if isinstance(value, list):
            out.append(str(key))
            out += [str(v) for v in value]
            continue
        text = str(value).strip()
        if value is False:
            text = "false"
        if text.startswith("[") and text.endswith("]"):
            out.append(str(key))
            out += text[1:-1].split()
            continue
        out += [str(key), text]
    return out


def _products(recipe: dict):
    """(test_case, platforms) pairs a recipe lists, expanding its product lists."""
    spec = recipe.get("spec", {})
    for entry in recipe.get("products") or []:
        cases = entry.get("test_case") or []
        for prod in entry.get("products") or [{}]:
            platforms = prod.get("platforms") or [spec.get("platforms")]
            envs = prod.get("environment") or []
            for case in cases:
                yield case, list(platforms), list(envs), prod


def recipe_targets(repo: str, rev: str) -> dict[tuple[str, str], list[dict]]:
    """(family, case) -> every h100 recipe entry that runs it on dgx_h100 in dev."""
    found: dict[tuple[str, str], list[dict]] = {}
    for path in _git(repo, "ls-tree", "-r", "--name-only", rev, RECIPES).split():
        if not path.endswith(".yaml"):
            continue
        recipe = yaml.safe_load(_show(repo, rev, path) or "{}") or {}
        spec = recipe.get("spec", {})
        family = spec.get("model")
        for case, platforms, envs, prod in _products(recipe):
            if "dgx_h100" not in platforms or (envs and "dev" not in envs):
                continue
            found.setdefault((family, case), []).append(
                {"recipe": path, "nodes": int(prod.get("nodes", spec.get("nodes", 1))),
                 "gpus_per_node": int(prod.get("gpus", spec.get("gpus", 8)))})
    return found


def _series(golden: dict, metric: str) -> list[tuple[int, float]]:
    m = golden.get(metric)
    if not isinstance(m, dict):  # a few files store a bare number (no series)
        return []
    out = []
    for k, v in m.get("values", {}).items():
        try:
            x = float(v)
        except (TypeError, ValueError):
            continue
        if math.isfinite(x):
            out.append((int(k), x))
    return sorted(out)


def _median_after_warmup(series: list[tuple[int, float]]) -> tuple[float | None, int]:
    steady = [x for i, x in series if i > WARMUP_ITERS]
    if not steady:
        return None, 0
    return statistics.median(steady), len(steady)


def build(repo: str, rev: str) -> dict:
    commit = _git(repo, "rev-parse", rev).strip()
    date = _git(repo, "log", "-1", "--format=%cI", commit).strip()
    targets = recipe_targets(repo, commit)
    paths = [p for p in _git(repo, "ls-tree", "-r", "--name-only", commit, CASES).split()
             if p.endswith("/" + GOLDEN)]
    cases = []
    for path in sorted(paths):
        case_dir = path.rsplit("/", 1)[0]
        family, case = case_dir.split("/")[-2:]
        cfg_text = _show(repo, commit, case_dir + "/model_config.yaml")
        if cfg_text is None:
            continue
        cfg = yaml.safe_load(cfg_text) or {}
        golden = json.loads(_show(repo, commit, path) or "{}")
        it_s, n_it = _median_after_warmup(_series(golden, "iteration-time"))
        mem = _series(golden, "mem-max-allocated-bytes")
        cur = _series(golden, "mem-allocated-bytes")
        tg = targets.get((family, case), [])
        shapes = {(t["nodes"], t["gpus_per_node"]) for t in tg}
        row = {
            "case": case, "family": family,
            "test_type": cfg.get("TEST_TYPE"),
            "script": SCRIPTS.get(family),
            "argv": argv_from_model_args(cfg.get("MODEL_ARGS") or {}),
            "env": {str(k): str(v) for k, v in (cfg.get("ENV_VARS") or {}).items()},
            "nodes": None, "gpus_per_node": None,
            "recipes": sorted({t["recipe"] for t in tg}),
            "median_iteration_time_s": it_s,
            "num_timed_iterations": n_it,
            "mem_max_allocated_bytes": max(x for _, x in mem) if mem else None,
            # the peak as of the second logged iteration (the optimizer state exists from
            # the first step on); later growth is data-dependent (MoE routing)
            "mem_max_allocated_bytes_early": mem[1][1] if len(mem) > 1 else None,
            # allocated at the last logged iteration's end: the step's persistent bytes
            "mem_allocated_bytes": cur[-1][1] if cur else None,
            "golden_path": path,
        }
        if len(shapes) == 1:
            row["nodes"], row["gpus_per_node"] = shapes.pop()
        cases.append(row)
    return {
        "source": {"repository": "github.com/NVIDIA/Megatron-LM", "commit": commit,
                   "commit_date": date, "golden_file": GOLDEN,
                   "recipes": RECIPES, "warmup_iterations_dropped": WARMUP_ITERS,
                   "built_by": "scripts/golden_dataset.py"},
        "cases": cases,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repo", required=True, help="a Megatron-LM git directory")
    ap.add_argument("--commit", default="HEAD")
    ap.add_argument("--out", default=str(OUT))
    a = ap.parse_args(argv)
    data = build(a.repo, a.commit)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{__import__('os').getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    tmp.replace(out)
    n = len(data["cases"])
    timed = sum(1 for c in data["cases"] if c["median_iteration_time_s"] and c["nodes"])
    print(f"{out}: {n} cases, {timed} with an iteration time and a stated node count "
          f"(Megatron-LM {data['source']['commit'][:12]})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
