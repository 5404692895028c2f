"""Build ``tests/data/bridge_other_releases.csv``: the MoE pre-training rows of every
Megatron-Bridge performance table (``docs/performance-summary.md`` and
``docs/performance-summary-archive.md``) on GB200, B200 and H100 whose (release, system,
model, precision, GPUs) the public set does not hold. They are never fitted: the
accuracy report projects them as an out-of-sample check of the MoE projection.

Model columns (architecture) are copied from the public set's row of the same model;
each row keeps the table's layout, batch, precision and measured tokens/s/GPU. Rows of
DeepSeek-V3 "w/ MTP" are left out (the row format has no MTP column), and so are
GB300 / B300 systems (no preset) and FSDP rows.

Usage: python scripts/bridge_other_releases.py /path/to/Megatron-Bridge [--write]
"""
from __future__ import annotations

import argparse
import csv
import io
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
PUBLIC = os.path.join(ROOT, "primus_ext", "data", "validation", "published_runs.csv")
OUT = os.path.join(ROOT, "tests", "data", "bridge_other_releases.csv")
DOCS = ("docs/performance-summary.md", "docs/performance-summary-archive.md")
# table model name -> the public row whose model columns the rows copy
MODELS = {"DeepSeekV3": "P117", "DeepSeekV3 (w/o MTP)": "P117", "GPT OSS 120B": "P123",
          "Qwen3_30B_a3B": "P127", "Qwen3_235B_a22B": "P128", "Kimi_K2": "P130"}
SYSTEMS = ("GB200", "B200", "H100")
PRECISION = {"BF16": ("bf16", ""), "FP8-MX": ("fp8", "precision MXFP8"),
             "MXFP8": ("fp8", "precision MXFP8"), "FP8-CS": ("fp8", "precision 'FP8'"),
             "FP8": ("fp8", "precision 'FP8'")}


def _show(repo: str, path: str) -> str:
    return subprocess.run(["git", "-C", repo, "show", f"HEAD:{path}"], capture_output=True,
                          text=True, check=True).stdout


def _first(cell: str) -> str:
    """'37556 (36108)' -> '37556'; '661[^note]' -> '661'; 'n/a' -> ''."""
    v = re.sub(r"\[\^[^\]]*\]", "", cell).split("(")[0].strip().replace(",", "")
    return "" if v.lower() == "n/a" else v


def table_rows(text: str):
    """(release, system, model, cells dict) of every pre-training table row."""
    rel = sec = model = system = None
    header = None
    for line in text.splitlines():
        m = re.match(r"## (\S+) NeMo Container", line)
        if m:
            rel, sec, header = m.group(1), None, None
            continue
        if line.startswith("### "):
            sec, header = line, None
            continue
        m = re.match(r"#### (Model|System): (.+)", line)
        if m:
            model = m.group(2).strip() if m.group(1) == "Model" else None
            system = m.group(2).strip() if m.group(1) == "System" else None
            header = None
            continue
        if not line.startswith("|") or rel is None or not sec or "Pre-Training" not in sec:
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0] in ("System", "Model"):
            header = cells
            continue
        if header is None or set(cells[0]) <= set("-: "):
            continue
        d = dict(zip(header, cells))
        yield rel, (d.get("System") or system or "").replace("DGX-", ""), \
            (d.get("Model") or model or "").strip(), d


def build(repo: str) -> list[dict]:
    with open(PUBLIC, newline="") as f:
        pub = list(csv.DictReader(f))
    by_id = {r["run_id"]: r for r in pub}
    have = {(r["source"], r["gpu"], r["model"], r["precision"], r["num_gpus"]) for r in pub}
    head = subprocess.run(["git", "-C", repo, "rev-parse", "HEAD"], capture_output=True,
                          text=True, check=True).stdout.strip()
    out, seen = [], set()
    for path in DOCS:
        for rel, system, model, d in table_rows(_show(repo, path)):
            if system not in SYSTEMS or model not in MODELS:
                continue
            prec = _first(d.get("Precision", "")).upper()
            if prec not in PRECISION or _first(d.get("FSDP", "0")) not in ("", "0"):
                continue
            p, note = PRECISION[prec]
            t = dict(by_id[MODELS[model]])
            n = int(_first(d["#-GPUs"]))
            key = (f"MegatronBridge-perf-{rel}", system, t["model"], p, str(n))
            if key in have or key in seen:
                continue
            seen.add(key)
            tp, pp, cp = (int(_first(d[k]) or 1) for k in ("TP", "PP", "CP"))
            vp = _first(d.get("VP", ""))
            t.update(
                run_id=f"B{len(out) + 1:03d}", source=key[0],
                source_detail=f"github.com/NVIDIA-NeMo/Megatron-Bridge@{head[:12]} {path} "
                              f"(section {rel} NeMo Container, Pre-Training Performance, "
                              f"{model}, DGX-{system} row)",
                gpu=system, num_gpus=n, precision=p, tp=tp, pp=pp,
                vp="" if vp in ("", "1") else vp, cp=cp, ep=_first(d["EP"]), etp="",
                dp=n // (tp * pp * cp), mbs=_first(d["MBS"]), gbs=_first(d["GBS"]),
                seq_len=_first(d["Sequence Length"]), recompute="", fsdp_or_zero="",
                measured_tokens_per_s_per_gpu=_first(d["Tokens / sec / GPU"]),
                measured_tflops_per_gpu=_first(d.get("Model TFLOP / sec / GPU", "")),
                measured_mfu="", measured_step_time_s="",
                notes="; ".join(x for x in (note, "MoE force-balanced and token-dropless "
                                                  "(the page's footnote)") if x),
                compile="", tp_comm_overlap="", pp_schedule="", fp8_recipe="")
            out.append(t)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("repo")
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    rows = build(args.repo)
    buf = io.StringIO()
    with open(PUBLIC, newline="") as f:
        fields = next(csv.reader(f))
    w = csv.DictWriter(buf, fieldnames=fields, lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    if args.write:
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(OUT), prefix=".bridge_rows.")
        with os.fdopen(fd, "w") as f:
            f.write(buf.getvalue())
        os.chmod(tmp, 0o644)
        os.replace(tmp, OUT)
    for r in rows:
        print(r["run_id"], r["source"][20:], r["gpu"], r["model"], r["precision"],
              r["measured_tokens_per_s_per_gpu"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
