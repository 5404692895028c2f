"""Capture a published optimisation ladder (one change per row, each row measured) and
hold the projector's per-feature gains against it (``tests/data/feature_ladders/``).

    python scripts/feature_ladder.py /path/to/Megatron-LM --write

The ladder: Megatron-LM's "Optimizing DeepSeek-V3 Training Performance on NVIDIA GB200
NVL72" (``docs/discussions/deepseek-v3-gb200-optimization/``): DeepSeek-V3, MXFP8, 256
GB200, TP1 PP8 VPP4 EP32 MBS1 GBS2048, from 494 to 970 TFLOP/s/GPU in twelve measured
steps (its Summary table), with the launch line of its final state in the reproduce guide
of the same folder. Most steps change software (kernels, CPU-side code, core binding) that
no flag expresses; the steps that change only flags are replayed here: each step's
launch line before and after is the guide's line with the flags the document names
(``STEPS``), projected by the drop-in (``--projection-backend simulate``, the committed
calibration), and the projected gain (after / before) is held against the published one.
Absolute values of the early rows carry the software of their day, so only the final row
is compared as a level. Nothing here is fitted.
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # scripts.moe_recipes, run as a script or loaded by path
OUT = ROOT / "tests" / "data" / "feature_ladders" / "deepseek_v3_gb200.json"
FOLDER = "docs/discussions/deepseek-v3-gb200-optimization"
DOC = f"{FOLDER}/deepseek-v3-gb200-optimization.md"
GUIDE = f"{FOLDER}/deepseek-v3-gb200-reproduce-guide.md"
# The document was removed from the repository on 2025-11-05 ("Remove DS-V3 doc - draft
# being updated", 3c1b98efdc); its last version, and the guide beside it (which later
# renamed --cuda-graph-scope to --cuda-graph-modules), are read at the commit before.
DOC_REV = "79e8592bb7"
TARGET = {"nodes": 64, "gpus_per_node": 4, "hardware": "gb200",
          "why": "the document: 256 GB200 (NVL72 compute trays of 4); the guide: EP 32 "
                 "inside one NVL72 rack ('Every 32 GB200 GPUs (8 nodes) are in the same "
                 "NVL domain')"}
_ROW = re.compile(r"^\|\s*DeepSeek-V3\s*\|\s*GB200\s*\|\s*MXFP8\s*\|\s*(\w+)\s*\|\s*(.+?)\s*"
                  r"\|\s*([\d.]+)\s*\|\s*$")

# Flag states the document describes, as edits of the guide's final line.
_A2A = {"drop": ["--moe-token-dispatcher-type", "--moe-flex-dispatcher-backend",
                 "--moe-hybridep-num-sms"], "add": ["--moe-token-dispatcher-type", "alltoall"]}
_DEEPEP = {"drop": ["--moe-flex-dispatcher-backend", "--moe-hybridep-num-sms"],
           "add": ["--moe-flex-dispatcher-backend", "deepep"]}
_NO_CG = {"drop": ["--cuda-graph-impl", "--cuda-graph-scope", "--cuda-graph-modules",
                   "--te-rng-tracker"]}
_OLD_RECOMPUTE = {"drop": ["--recompute-modules"],
                  "add": ["--recompute-modules", "mlp", "mla_up_proj"]}
_NO_ROUTER_FUSION = {"drop": ["--moe-router-fusion"]}

# (table row before, table row after, what changed, edits before, edits after, the
# document's words for it)
STEPS = (
    ("Fuse torch.zeros for scaling factor allocation & Permute kernel Optimization",
     "Router fusion", "--moe-router-fusion",
     [_A2A, _NO_CG, _OLD_RECOMPUTE, _NO_ROUTER_FUSION], [_A2A, _NO_CG, _OLD_RECOMPUTE],
     "2.1.4: router kernels fused (72 to 31); 'The option to enable this in MCore is "
     "--moe-router-fusion'"),
    ("Router fusion", "Enable DeepEP (Will switch to HybridEP)",
     "alltoall -> flex dispatcher, DeepEP backend",
     [_A2A, _NO_CG, _OLD_RECOMPUTE], [_DEEPEP, _NO_CG, _OLD_RECOMPUTE],
     "Baseline item 9: the NCCL AlltoAll backend ('--moe-token-dispatcher-type "
     "alltoall'); 2.2: 'enabling DeepEP reduces the CPU overhead of the router and "
     "preprocess'"),
    ("Enable DeepEP (Will switch to HybridEP)", "Remove up\\_proj recompute",
     "--recompute-modules mlp up_proj -> mlp moe_act",
     [_DEEPEP, _NO_CG, _OLD_RECOMPUTE], [_DEEPEP, _NO_CG],
     "Baseline: '--recompute-modules mlp up_proj'; 2.2: 'the recomputation parameters "
     "were changed to --recompute-modules mlp moe_act'"),
    ("Remove up\\_proj recompute", "CUDA Graphs",
     "CUDA graphs (TE, attn moe_router moe_preprocess)",
     [_DEEPEP, _NO_CG], [_DEEPEP],
     "2.1.5 'CUDA Graphs'; the guide's 'Partial CUDA Graphs': --cuda-graph-impl "
     "transformer_engine --cuda-graph-scope attn moe_router moe_preprocess "
     "--te-rng-tracker"),
    ("CUDA Graphs capture shared expert", "HybridEP", "DeepEP -> HybridEP (32 SMs)",
     [_DEEPEP], [],
     "2.3: HybridEP; the guide: --moe-flex-dispatcher-backend hybridep "
     "--moe-hybridep-num-sms 32"),
)


def _git(repo: str, *args: str) -> str:
    return subprocess.run(["git", "-C", repo, *args], check=True, capture_output=True,
                          text=True).stdout


def guide_flags(text: str) -> list[str]:
    """The argv after ``pretrain_gpt.py`` in the guide's "Launch script" block."""
    block = text.split("### Launch script", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    lines = [ln.strip().rstrip("\\").strip() for ln in block.splitlines()]
    start = next(i for i, ln in enumerate(lines) if ln.endswith("pretrain_gpt.py"))
    import shlex
    return [tok for ln in lines[start + 1:] if ln for tok in shlex.split(ln)]


def history(text: str) -> list[dict]:
    """The Summary table: dispatcher, the step's name and its TFLOP/s/GPU, in order."""
    return [{"dispatcher": d, "feature": f, "tflops_per_gpu": float(t)}
            for d, f, t in (m.groups() for m in map(_ROW.match, text.splitlines()) if m)]


def apply_edits(flags: list[str], edits: list[dict]) -> list[str]:
    """``flags`` with each edit's flags (and their values) dropped, then its ``add``."""
    out = list(flags)
    for e in edits:
        drop = set(e.get("drop", ()))
        kept, skipping = [], False
        for tok in out:
            if tok.startswith("--"):
                skipping = tok in drop
            if not skipping:
                kept.append(tok)
        out = kept + list(e.get("add", ()))
    return out


def capture(repo: str, rev: str) -> dict:
    guide_commit = _git(repo, "rev-parse", rev).strip()
    doc_commit = _git(repo, "rev-parse", DOC_REV).strip()
    flags = guide_flags(_git(repo, "show", f"{guide_commit}:{GUIDE}"))
    table = history(_git(repo, "show", f"{doc_commit}:{DOC}"))
    by_name = {r["feature"]: r["tflops_per_gpu"] for r in table}
    steps = [{"before": b, "after": a, "change": what,
              "published_before": by_name[b], "published_after": by_name[a],
              "edits_before": eb, "edits_after": ea, "document": words}
             for b, a, what, eb, ea, words in STEPS]
    return {"source": {"repo": "NVIDIA/Megatron-LM", "doc_commit": doc_commit,
                       "doc": DOC, "guide_commit": guide_commit, "guide": GUIDE,
                       "url": f"https://github.com/NVIDIA/Megatron-LM/blob/{doc_commit}/{DOC}"},
            "read_by": "scripts/feature_ladder.py", "target": TARGET,
            "final": {"feature": table[-1]["feature"],
                      "tflops_per_gpu": table[-1]["tflops_per_gpu"]},
            "history": table, "steps": steps, "flags": flags}


def project_line(flags: list[str], target: dict) -> float:
    """Projected TFLOP/s/GPU of a ladder line (moe_recipes.project_line: the drop-in's
    analytic path)."""
    from scripts.moe_recipes import project_line as drop_in
    est, refused = drop_in(flags, target["nodes"], target["gpus_per_node"],
                           target["hardware"])
    if refused is not None:
        raise RuntimeError(f"the drop-in refused a ladder line: {refused}")
    return est["tflops_per_gpu"]


def project_ladder(data: dict | None = None) -> dict:
    """The final line's projected level and each flag step's projected gain."""
    data = data or json.loads(OUT.read_text())
    flags, target = data["flags"], data["target"]
    final = project_line(flags, target)
    steps = []
    for s in data["steps"]:
        before = project_line(apply_edits(flags, s["edits_before"]), target)
        after = project_line(apply_edits(flags, s["edits_after"]), target)
        steps.append({**s, "projected_before": before, "projected_after": after,
                      "published_gain": s["published_after"] / s["published_before"],
                      "projected_gain": after / before})
    return {"final_published": data["final"]["tflops_per_gpu"], "final_projected": final,
            "final_error": final / data["final"]["tflops_per_gpu"] - 1, "steps": steps}


def ladder_section() -> list[str]:
    """docs/accuracy.md's section on the ladder (generated)."""
    data = json.loads(OUT.read_text())
    res = project_ladder(data)
    src = data["source"]
    lines = ["## A published optimisation ladder: DeepSeek-V3 on 256 GB200 (never fitted)", "",
             f"Megatron-LM's DeepSeek-V3 GB200 optimisation report ({src['repo']}"
             f"@{src['doc_commit'][:10]} `{src['doc']}`) measures each step from 494 to "
             f"{data['final']['tflops_per_gpu']:,.0f} TFLOP/s/GPU (MXFP8, TP1 PP8 VPP4 EP32, "
             "MBS 1, GBS 2048); its reproduce guide gives the final launch line "
             f"(@{src['guide_commit'][:10]}, `tests/data/feature_ladders/`, "
             "`scripts/feature_ladder.py`). The final line, read by the drop-in: "
             f"**{res['final_projected']:,.1f}** projected against "
             f"{res['final_published']:,.1f} published (**{res['final_error']:+.1%}**).", "",
             "Steps that change only flags, each replayed on the guide's line with the "
             "flags the report names (the other steps change kernels, CPU-side code or "
             "core binding, which no flag expresses; they are why the early rows' levels "
             "are not compared):", "",
             "| step | change | published gain | projected gain | difference |",
             "| --- | --- | ---: | ---: | ---: |"]
    for s in res["steps"]:
        step = s["after"].replace("\\_", "_")
        lines.append(f"| {step} | {s['change']} | {s['published_gain'] - 1:+.1%} | "
                     f"{s['projected_gain'] - 1:+.1%} | "
                     f"{s['projected_gain'] - s['published_gain']:+.1%} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("repo", nargs="?", help="a Megatron-LM checkout (or bare git directory)")
    p.add_argument("--rev", default=DOC_REV,
                   help="where the reproduce guide is read (default: the report's commit)")
    p.add_argument("--write", action="store_true", help=f"write {OUT.relative_to(ROOT)}")
    a = p.parse_args(argv)
    if not a.repo:
        print("\n".join(ladder_section()))
        return 0
    from primus_ext.util.files import capture_out
    data = capture(a.repo, a.rev)
    capture_out(OUT, data, a.write, f"{len(data['steps'])} steps, {len(data['flags'])} flags")
    return 0


if __name__ == "__main__":
    sys.exit(main())
