"""Issue 15, defect 6: free text never becomes a command. megatron_args.sh quotes every
value and escapes every comment; overrides.txt and recipe.yaml give back the same values.
The script is run by bash with torchrun replaced by a function that prints its argv, in
an empty directory: a value that escaped its quotes would create a file there."""
from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from primus_ext.config import compose
from primus_ext.emit.overrides import recipe_config, spec_overrides
from primus_ext.frameworks.megatron.flags import megatron_argv, torchrun_script

HOSTILE = ["x\ntouch PWNED\ny", "a'b\"c", "$(touch PWNED)", "`touch PWNED`", "ünï cödé ✓",
           "; touch PWNED #", "${IFS}touch${IFS}PWNED", "\\", "x\r\ntouch PWNED", "}{",
           "$'\\n'touch PWNED", "-- --help", ""]
BASH = shutil.which("bash")
pytestmark = pytest.mark.skipif(BASH is None, reason="needs bash")


def _run_script(script: str, cwd) -> tuple[list[str], str]:
    (cwd / "megatron_args.sh").write_text(script)
    stub = ('torchrun() { printf "%s\\0" "$@"; printf "HW=%s\\0" '
            '"$PRIMUS_TARGET_HARDWARE"; }; source ./megatron_args.sh')
    env = {k: v for k, v in os.environ.items()
           if k not in ("NNODES", "GPUS_PER_NODE", "PRIMUS_TARGET_HARDWARE", "MEGATRON_LM")}
    run = subprocess.run([BASH, "-c", stub], cwd=cwd, env=env, capture_output=True,
                         timeout=30)
    assert run.returncode == 0, run.stderr.decode()
    out = run.stdout.decode().split("\0")[:-1]
    return out[:-1], out[-1][len("HW="):]


def _expected(spec) -> list[str]:
    c = spec.cluster
    return ["--nnodes", str(c.num_nodes), "--nproc-per-node", str(c.node_size),
            "--node-rank", "0", "--master-addr", "localhost", "--master-port", "6000",
            "/workspace/Megatron-LM/pretrain_gpt.py", *megatron_argv(spec)]


@pytest.mark.parametrize("text", HOSTILE)
def test_hostile_title_stays_a_comment(tmp_path, text):
    spec = compose(["parallel.tp=2"])
    argv, hw = _run_script(torchrun_script(spec, title=f"model {text} wins"), tmp_path)
    assert argv == _expected(spec)
    assert hw == "h100"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["megatron_args.sh"]


@pytest.mark.parametrize("text", [t for t in HOSTILE if t.isprintable() and t])
def test_hostile_values_are_one_word_each(tmp_path, text):
    """A hardware name (through hardware_overrides) and recompute module names are free
    text that reaches the script's lines."""
    spec = compose(["train.recompute_granularity=selective"])
    hw = dataclasses.replace(spec.cluster.hardware, name=text)
    spec = dataclasses.replace(
        spec, cluster=dataclasses.replace(spec.cluster, hardware=hw),
        train=dataclasses.replace(spec.train, recompute_modules=(text, "core_attn")))
    argv, got_hw = _run_script(torchrun_script(spec, title=text), tmp_path)
    assert argv == _expected(spec)
    assert text in argv
    assert got_hw == text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["megatron_args.sh"]


def test_a_newline_in_a_model_name_is_refused():
    with pytest.raises(ValueError, match="model.name="):
        compose(["model.name='x\ntouch PWNED\ny'"])


_NAMES = st.text(st.characters(blacklist_categories=("Cc", "Cs", "Zl", "Zp")),
                 min_size=1, max_size=20).filter(str.isprintable)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(st.sampled_from([t for t in HOSTILE if t.isprintable() and t]), _NAMES))
def test_property_overrides_and_recipe_give_back_the_name(name):
    from primus_ext.util.values import hydra_value
    spec = compose([f"model.name={hydra_value(name)}"])
    assert spec.model.name == name
    lines = spec_overrides(spec)
    assert all("\n" not in line for line in lines)
    assert compose(lines) == spec  # overrides.txt, one override a line
    cfg = OmegaConf.create(recipe_config(lines))
    assert OmegaConf.to_container(cfg, resolve=True)["model"]["name"] == name
