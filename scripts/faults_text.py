"""The explicit cases of scripts/fault_tally.py about text and size: hostile text in the
launch script and the recipe, misuse of the Python API, the trace of a long pipeline, the
drop-in's default target."""
from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
from pathlib import Path

from fault_tally import classify_error, classify_exception
from faults import TUNE

HOSTILE = ["x\ntouch PWNED\ny", "a'b\"c", "$(touch PWNED)", "`touch PWNED`", "ünï ✓",
           "; touch PWNED #", "${IFS}touch${IFS}PWNED", "\\", "}{", "$'\\n'touch PWNED"]


def script_argv(script: str, cwd: Path) -> tuple[list[str], str, list[str]]:
    """Run a megatron_args.sh with torchrun replaced by a function printing its argv."""
    (cwd / "megatron_args.sh").write_text(script)
    stub = ('torchrun() { printf "%s\\0" "$@"; printf "HW=%s\\0" '
            '"$PRIMUS_TARGET_HARDWARE"; }; source ./megatron_args.sh')
    env = {k: v for k, v in os.environ.items()
           if k not in ("NNODES", "GPUS_PER_NODE", "PRIMUS_TARGET_HARDWARE", "MEGATRON_LM")}
    run = subprocess.run([shutil.which("bash"), "-c", stub], cwd=cwd, env=env,
                         capture_output=True, timeout=30)
    out = run.stdout.decode(errors="replace").split("\0")[:-1]
    files = sorted(p.name for p in cwd.iterdir())
    return out[:-1], out[-1][3:] if out else "", files


def shell(work, home, cli):
    c = "launch-script text"
    if shutil.which("bash") is None:
        return
    from primus_ext.config import compose
    from primus_ext.frameworks.megatron.flags import megatron_argv, torchrun_script

    base = compose(["train.recompute_granularity=selective"])
    for i, text in enumerate(HOSTILE):
        def check(text=text, i=i):
            hw = dataclasses.replace(base.cluster.hardware, name=text) \
                if text.isprintable() else base.cluster.hardware
            spec = dataclasses.replace(
                base, cluster=dataclasses.replace(base.cluster, hardware=hw),
                train=dataclasses.replace(base.train, recompute_modules=(text,)))
            cwd = work / f"sh{i}"
            cwd.mkdir()
            argv, got_hw, files = script_argv(torchrun_script(spec, title=text), cwd)
            if files != ["megatron_args.sh"]:
                return "hang-or-corruption", f"the script ran text as a command: {files}"
            if argv[-len(megatron_argv(spec)):] != megatron_argv(spec) or got_hw != hw.name:
                return "silent", "the script's argv differs from the recipe's flags"
            return "survived", "one word each, nothing run"
        yield c, repr(text), check

    def tune_with_a_hostile_name():
        out = work / "hostile-recipe"
        name = "$(touch PWNED) `x` 'q' ü"
        from primus_ext.util.values import hydra_value
        run = cli([*TUNE, f"model.name={hydra_value(name)}", f"tune.out_dir={out}"], home)
        if run.returncode != 0:
            return classify_error(run)
        lines = (out / "overrides.txt").read_text().splitlines()
        if compose(lines).model.name != name:
            return "silent", "overrides.txt does not give back the name"
        argv, _, files = script_argv((out / "megatron_args.sh").read_text(), out)
        if "PWNED" in files:
            return "hang-or-corruption", "megatron_args.sh ran the name"
        return "survived", "overrides.txt and megatron_args.sh hold the name as text"
    yield c, "mode=tune with a hostile model.name", tune_with_a_hostile_name


def python_api():
    import primus_ext
    from primus_ext.config import compose
    c = "python API"
    spec = compose([])
    yield c, "compose('p')", lambda: classify_exception(lambda: primus_ext.compose("p"),
                                                        ("list of Hydra override",))
    yield c, "compose([1])", lambda: classify_exception(lambda: primus_ext.compose([1]),
                                                        ("override",))
    yield c, "project(None)", lambda: classify_exception(lambda: primus_ext.project(None),
                                                         ("RunSpec",))
    yield c, "memory('x')", lambda: classify_exception(lambda: primus_ext.memory("x"),
                                                       ("RunSpec",))
    yield c, "replace(parallel, fsdp='off')", lambda: classify_exception(
        lambda: dataclasses.replace(spec.parallel, fsdp="off"), ("parallel.fsdp",))
    yield c, "replace(train, seq_length=1e3)", lambda: classify_exception(
        lambda: dataclasses.replace(spec.train, seq_length=1e3), ("train.seq_length",))
    yield c, "replace(model, name=None)", lambda: classify_exception(
        lambda: dataclasses.replace(spec.model, name=None), ("model.name",))


def trace_and_dropin(work, home, cli):
    c = "trace size"

    def big_trace():
        out = work / "big.json"
        run = cli(["train.global_batch_size=819200", f"trace={out}"], home)
        if run.returncode != 0:
            return classify_error(run)
        size_mb = out.stat().st_size / 1e6
        if size_mb > 40 or "drew the first" not in run.stderr:
            return "silent", f"{size_mb:.0f} MB trace, cap not said"
        return "survived", f"{size_mb:.0f} MB; {run.stderr.strip().splitlines()[-1][:120]}"
    yield c, "trace of GBS 819200", big_trace

    c = "drop-in target"

    def tiny_batch():
        from primus_ext.frameworks.megatron.args import parse_launch_args
        saved = {k: os.environ.pop(k) for k in ("NNODES", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                                                "GPUS_PER_NODE", "PRIMUS_TARGET_HARDWARE")
                 if k in os.environ}
        try:
            return classify_exception(lambda: parse_launch_args(
                ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
                 "--seq-length", "128", "--max-position-embeddings", "128",
                 "--micro-batch-size", "1", "--global-batch-size", "2"]),
                ("global_batch_size", "target: the default"))
        finally:
            os.environ.update(saved)
    yield c, "tiny batch, no target flags", tiny_batch
