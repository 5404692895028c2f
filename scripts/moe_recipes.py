"""Capture Megatron-LM's MoE recipes (``examples/moe_recipes``) with their published
throughput, for the drop-in's out-of-sample check (``tests/data/moe_recipes/``).

    python scripts/moe_recipes.py /path/to/Megatron-LM [--rev dev] --write

The recipe index (``examples/moe_recipes/README.md``) prints, per recipe, its GPUs and
the median TFLOP/s/GPU Megatron-LM logged; each recipe's YAML holds the training
arguments under ``ARGS``. A recipe becomes a launch line as a shell passes it: each key
``--key-with-dashes``, ``true`` a bare flag, ``false`` and null left out, a list one token
per item, a string split on whitespace (``recompute_modules: moe_act layernorm`` is two
modules). Rows without a figure, or on hardware without a preset, are kept with the
reason and not projected. Nothing here is fitted.
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "data" / "moe_recipes" / "recipes.json"
INDEX = "examples/moe_recipes/README.md"
ROW = re.compile(r'<a href="([^"]+\.yaml)">([^<]*)</a></td>\s*<td>(\d+)</td>\s*<td>([^<]*)'
                 r'</td>\s*<td>([^<]*)</td>\s*<td>([^<]*)</td>\s*<td>([^<]*)</td>')


def argv_of(args: dict) -> list[str]:
    """The recipe's ``ARGS`` as the command line a shell would pass (module docstring)."""
    out: list[str] = []
    for key, value in args.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            out.append(flag)
        elif value is False or value is None:
            continue
        elif isinstance(value, list):
            out += [flag, *(str(v) for v in value)]
        else:
            out += [flag, *str(value).split()]
    return out


def _git(repo: str, *args: str) -> str:
    return subprocess.run(["git", "-C", repo, *args], check=True, capture_output=True,
                          text=True).stdout


def capture(repo: str, rev: str) -> dict:
    import yaml

    from primus_ext.presets import hardware_preset, list_presets
    commit = _git(repo, "rev-parse", rev).strip()
    readme = _git(repo, "show", f"{commit}:{INDEX}")
    presets = set(list_presets("hardware"))
    recipes = []
    for path, label, gpus, layout, batch, features, tflops in ROW.findall(readme):
        full = f"examples/moe_recipes/{path}"
        model, hardware = path.split("/")[0], path.split("/")[1]
        doc = yaml.safe_load(_git(repo, "show", f"{commit}:{full}"))
        skip = None
        if not tflops.strip():
            skip = "the index prints no TFLOP/s for it"
        elif hardware not in presets:
            skip = f"no hardware preset for {hardware}"
        recipes.append({
            "name": path[:-len(".yaml")].replace("/", "__"), "path": full,
            "model": model, "label": label, "hardware": hardware, "gpus": int(gpus),
            # the preset's node (NVL72: a compute tray of 4); a GPU without one: 8
            "gpus_per_node": hardware_preset(hardware).gpus_per_node
            if hardware in presets else 8,
            "index_layout": layout.strip(), "index_batch": batch.strip(),
            "features": features.strip(),
            "median_tflops_per_gpu": float(tflops) if tflops.strip() else None,
            "skip": skip, "flags": argv_of(doc["ARGS"])})
    return {"source": {"repo": "NVIDIA/Megatron-LM", "commit": commit, "index": INDEX,
                       "url": f"https://github.com/NVIDIA/Megatron-LM/tree/{commit}/"
                              "examples/moe_recipes"},
            "read_by": "scripts/moe_recipes.py", "recipes": recipes}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("repo", help="a Megatron-LM checkout (or bare git directory)")
    p.add_argument("--rev", default="dev")
    p.add_argument("--write", action="store_true", help=f"write {OUT.relative_to(ROOT)}")
    a = p.parse_args(argv)
    from primus_ext.util.files import capture_out
    data = capture(a.repo, a.rev)
    capture_out(OUT, data, a.write, f"{len(data['recipes'])} recipes at {data['source']['commit']}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())


def project_line(flags: list[str], nodes: int, gpus_per_node: int,
                 hardware: str) -> tuple[dict | None, str | None]:
    """A launch line through the drop-in's analytic path (``--projection-backend
    simulate``, the committed calibration) on ``nodes`` x ``gpus_per_node`` of
    ``hardware``: (the projection JSON, None), or (None, the one-line error it was
    refused with)."""
    import contextlib
    import io
    import tempfile

    from primus_ext.frameworks.megatron.launch import main as launch
    target = ["--target-nodes", str(nodes), "--target-gpus-per-node", str(gpus_per_node),
              "--target-hardware", hardware, "--project-only", "--projection-backend",
              "simulate"]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "p.json"
        err = io.StringIO()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            try:
                rc = launch(flags + target + ["--projection-out", str(path)])
            except SystemExit as exc:  # argparse's own errors (an invalid choice)
                rc = exc.code or 2
        if rc != 0:
            lines = err.getvalue().strip().splitlines()
            return None, lines[-1] if lines else f"exit {rc}"
        return json.loads(path.read_text()), None


def project_recipes(data: dict | None = None) -> list[dict]:
    """Each recipe with a figure and a preset, through the drop-in's analytic path
    (``project_line``): the projection's TFLOP/s/GPU (Megatron-LM's
    num_floating_point_operations, as the index) and its error against the index, or the
    one-line error the reader gave."""
    data = data or json.loads(OUT.read_text())
    out = []
    for r in data["recipes"]:
        row = {k: r[k] for k in ("name", "model", "label", "hardware", "gpus",
                                 "median_tflops_per_gpu", "skip")}
        if r["skip"]:
            out.append(row)
            continue
        est, refused = project_line(r["flags"], r["gpus"] // r["gpus_per_node"],
                                    r["gpus_per_node"], r["hardware"])
        if refused is not None:
            row["rejected"] = refused
        else:
            row["projected_tflops_per_gpu"] = est["tflops_per_gpu"]
            row["error"] = est["tflops_per_gpu"] / r["median_tflops_per_gpu"] - 1
        out.append(row)
    return out


def recipes_section() -> list[str]:
    """docs/accuracy.md's section on the recipes (generated)."""
    from primus_ext.project.validate import percentile
    data = json.loads(OUT.read_text())
    rows = project_recipes(data)
    errs = [abs(r["error"]) for r in rows if "error" in r]
    src = data["source"]
    lines = ["## Megatron-LM's MoE recipes (never fitted)", "",
             f"The MoE recipes of {src['repo']}@{src['commit'][:12]} "
             "(`examples/moe_recipes`: each recipe's full training arguments and the median "
             "TFLOP/s/GPU its index prints), read by the drop-in as launch lines "
             "(`tests/data/moe_recipes/`, `scripts/moe_recipes.py`) and projected with the "
             f"committed calibration: {len(errs)} projected, median |error| "
             f"**{percentile(errs, 50):.1%}**, p90 **{percentile(errs, 90):.1%}**.", "",
             "| recipe | GPUs | published TFLOP/s | projected | error |",
             "| --- | ---: | ---: | ---: | --- |"]
    for r in rows:
        name = f"{r['model']} {r['label']}"
        pub = f"{r['median_tflops_per_gpu']:,.1f}" if r["median_tflops_per_gpu"] else "-"
        if "error" in r:
            lines.append(f"| {name} | {r['gpus']} | {pub} | "
                         f"{r['projected_tflops_per_gpu']:,.1f} | {r['error']:+.1%} |")
        else:
            why = r.get("skip") or "not read: " + r["rejected"].replace("|", "/")
            lines.append(f"| {name} | {r['gpus']} | {pub} | - | {why} |")
    return lines
