"""Real Megatron-LM launch scripts (tests/data/launch_scripts: flags captured with their
repository, commit and path) through the drop-in launcher's parser and its analytic
``--project-only --projection-backend simulate`` path."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from primus_ext.frameworks.megatron.args import is_known, parse_launch_args
from primus_ext.frameworks.megatron.line_flags import _final_batch
from primus_ext.frameworks.megatron.no_effect import LISTED_NOT_MODELLED
from primus_ext.spec.model import padded_vocab
from primus_ext.frameworks.megatron.launch import main
from primus_ext.frameworks.megatron.layout_string import expand

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "launch_scripts"
SCRIPTS = {p.stem: json.loads(p.read_text()) for p in sorted(DATA.glob("*.json"))}


def _target(doc: dict) -> list[str]:
    t = doc["target"]
    return ["--target-nodes", str(t["nodes"]), "--target-gpus-per-node",
            str(t["gpus_per_node"]), "--target-hardware", t.get("hardware", "h100")]


def _value(flags: list[str], flag: str, default=None):
    return flags[flags.index(flag) + 1] if flag in flags else default


def test_the_corpus_is_real_and_large_enough():
    assert len(SCRIPTS) >= 24
    repos = {d["source"]["repo"] for d in SCRIPTS.values()}
    assert {"NVIDIA/Megatron-LM", "yanring/Megatron-MoE-ModelZoo", "ROCm/Megatron-LM",
            "alibaba/Pai-Megatron-Patch", "swiss-ai/Megatron-LM",
            "SURF-ML/Megatron-LM-Snellius"} <= repos
    for doc in SCRIPTS.values():
        src = doc["source"]
        assert len(src["commit"]) == 40 and src["path"].endswith((".sh", ".job"))
        assert "--num-layers" in doc["flags"] and doc["target"]["nodes"] >= 1


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_every_flag_is_modelled_or_listed_as_no_effect(name):
    flags = {t.split("=", 1)[0] for t in SCRIPTS[name]["flags"] if t.startswith("--")}
    assert sorted(f for f in flags if not is_known(f)) == []


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_every_script_projects_analytically_and_keeps_what_it_says(name, tmp_path,
                                                                     capsys):
    doc = SCRIPTS[name]
    flags = doc["flags"]
    out = tmp_path / "projection.json"
    rc = main(flags + _target(doc) + [
        "--project-only", "--projection-backend", "simulate", "--projection-out", str(out)])
    err = capsys.readouterr().err
    assert rc == 0, err
    # Only flags listed with their reason (no_effect.LISTED_NOT_MODELLED) are not modelled.
    la = parse_launch_args(flags + _target(doc))
    assert [x for x in la.not_modelled
            if x.split(" ", 1)[0] not in LISTED_NOT_MODELLED] == []
    est = json.loads(out.read_text())
    cfg = est["config"]
    model, par, train = cfg["model"], cfg["parallel"], cfg["train"]
    assert est["step_time_s"] > 0 and est["backend"] == "simulate"
    assert model["num_layers"] == int(_value(flags, "--num-layers"))
    assert par["tp"] == int(_value(flags, "--tensor-model-parallel-size", 1))
    assert par["pp"] == int(_value(flags, "--pipeline-model-parallel-size", 1))
    if _value(flags, "--tokenizer-type") == "NullTokenizer":
        assert model["vocab_size"] == int(_value(flags, "--vocab-size")) + 1
    given = _value(flags, "--padded-vocab-size")
    if given is not None or "--patch-tokenizer-type" in flags:
        # --padded-vocab-size, or Pai-Megatron-Patch's tokenizer size, is the embedding
        # as given: nothing more is padded.
        assert padded_vocab(model["vocab_size"], model["make_vocab_size_divisible_by"],
                            par["tp"]) == model["vocab_size"]
        assert given is None or model["vocab_size"] == int(given)
    else:
        assert model["make_vocab_size_divisible_by"] == int(
            _value(flags, "--make-vocab-size-divisible-by", 128))
    if "expected" in doc:  # what the script's tokenizer and batch come to, by hand
        assert model["vocab_size"] == doc["expected"]["vocab_size"]
    gbs = _value(flags, "--global-batch-size")
    if "--step-batch-size-schedule" in flags:
        i = flags.index("--step-batch-size-schedule") + 1
        j = i
        while j < len(flags) and not flags[j].startswith("--"):
            j += 1
        gbs = _final_batch(" ".join(flags[i:j]))[0]
    if gbs is not None:
        assert train["global_batch_size"] == int(gbs)
    assert train["micro_batch_size"] == int(_value(flags, "--micro-batch-size", 1))
    assert train["seq_length"] == int(_value(flags, "--seq-length"))
    assert par["cp"] == int(_value(flags, "--context-parallel-size", 1))
    assert par["ep"] == int(_value(flags, "--expert-model-parallel-size", 1))
    if "--num-experts" in flags:
        assert model["num_moe_experts"] == int(_value(flags, "--num-experts"))
        assert model["moe_router_topk"] == int(_value(flags, "--moe-router-topk", 2))
    if "--num-virtual-stages-per-pipeline-rank" in flags:
        assert par["vpp"] == int(_value(flags, "--num-virtual-stages-per-pipeline-rank"))
    layout = _value(flags, "--pipeline-model-parallel-layout")
    if layout:
        stages = expand(layout)
        assert par["vpp"] == len(stages) // par["pp"]
        assert par["pipeline_layout"] == [s.count("t") for s in stages]
    if "--fp8-format" in flags:
        assert train["precision"] == "fp8"
        assert train["fp8_recipe"] == _value(flags, "--fp8-recipe", "delayed")
    else:
        assert train["precision"] == ("bf16" if "--bf16" in flags else
                                      "fp16" if "--fp16" in flags else "fp32")
    gran = _value(flags, "--recompute-granularity",
                  "selective" if "--recompute-activations" in flags else None)
    assert train["recompute_granularity"] == gran
    if "--recompute-modules" in flags:
        i = flags.index("--recompute-modules") + 1
        mods = []
        while i < len(flags) and not flags[i].startswith("--"):
            mods.append(flags[i])
            i += 1
        assert train["recompute_modules"] == mods


def test_the_analytic_path_imports_no_torch(tmp_path):
    doc = SCRIPTS["zoo_deepseek_v3_h100"]
    argv = doc["flags"] + _target(doc) + ["--project-only", "--projection-backend",
                                          "simulate"]
    code = ("import sys, json; from primus_ext.frameworks.megatron.launch import main; "
            f"rc = main(json.loads({json.dumps(json.dumps(argv))})); "
            "assert rc == 0 and 'torch' not in sys.modules, sorted(sys.modules)[:5]")
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "tokens/s/GPU" in res.stdout


def test_a_line_the_measurement_cannot_build_gets_one_line_and_exit_3():
    """Megatron-LM's GPT-OSS line (sliding-window layers) through the default backend:
    megatron-core's local spec has no sliding window, so the measurement stops before
    building anything, with one line that names the field and the way out."""
    doc = SCRIPTS["mlm_gptoss_02_train"]
    argv = doc["flags"] + _target(doc) + ["--project-only"]
    code = ("import sys, json; from primus_ext.frameworks.megatron.launch import main; "
            f"sys.exit(main(json.loads({json.dumps(json.dumps(argv))})))")
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 3, res.stderr[-2000:]
    assert "Traceback" not in res.stderr
    assert "model.window_size: sliding-window attention" in res.stderr
    assert "--projection-backend simulate" in res.stderr


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_the_written_launch_line_reads_back_as_the_script(name):
    """flags.py writes what args.py read from the real script: reading that back gives
    the same spec (the recipe a --recipe-out run writes)."""
    from primus_ext.frameworks.megatron.args import parse_launch_args
    from primus_ext.frameworks.megatron.flags import megatron_argv
    doc = SCRIPTS[name]
    spec = parse_launch_args(doc["flags"] + _target(doc)).spec
    back = parse_launch_args(megatron_argv(spec) + _target(doc), name=spec.model.name)
    assert back.spec == spec and back.not_modelled == ()


def test_recipe_out_writes_a_launch_line(tmp_path, capsys):
    doc = SCRIPTS["mlm_llama3_8b_h100_fp8"]
    rc = main(doc["flags"] + _target(doc) + ["--project-only", "--projection-backend",
                                             "simulate", "--recipe-out", str(tmp_path)])
    assert rc == 0, capsys.readouterr().err
    script = (tmp_path / "megatron_args.sh").read_text()
    assert "--fp8-format hybrid" in script and "--fp8-recipe" not in script
    assert "--sequence-parallel" not in script  # turned off at TP 1, as Megatron-LM does
    assert "backend=profile" not in (tmp_path / "overrides.txt").read_text()


@pytest.mark.parametrize("name", sorted(n for n, d in SCRIPTS.items()
                                        if d["source"]["repo"] == "NVIDIA/Megatron-LM"
                                        and d["target"]["nodes"] == 1))
def test_nvidias_single_node_h100_scripts_fit(name):
    """NVIDIA's examples written for one 8 x H100 node fit its 80 GiB (Llama 3 8B FP8,
    Megatron-FSDP Llama 3 8B FP8, GPT-OSS), in the layout NVIDIA benchmarked them in
    (``_BENCHMARKED``)."""
    from primus_ext.frameworks.megatron.args import parse_launch_args
    from primus_ext.project.estimate import project
    doc = SCRIPTS[name]
    flags = list(doc["flags"])
    for flag, value in _BENCHMARKED.get(name, {}).items():
        flags[flags.index(flag) + 1] = value
    assert project(parse_launch_args(flags + _target(doc)).spec).fits


# Layouts NVIDIA measured, where the script at this commit writes another one:
# examples/llama/README.md "FP8 Performance" runs LLAMA3-8B on 8 GPUs at CP 2 (13812
# tokens/s/GPU); train_llama3_8b_h100_fp8.sh sets CP_SIZE=1. At CP 1 the step's peak is
# the fused cross entropy's backward (memory/head.py: the saved fp32 softmax, its
# compiled clone and the bf16 gradient, 10 bytes per logit on 8192 x 128256 logits),
# about 80.7 GiB allocated: more than the device (test below).
_BENCHMARKED = {"mlm_llama3_8b_h100_fp8": {"--context-parallel-size": "2"}}


def test_llama3_8b_fp8_script_at_cp1_is_over_the_device():
    from primus_ext.frameworks.megatron.args import parse_launch_args
    from primus_ext.memory import memory_report
    doc = SCRIPTS["mlm_llama3_8b_h100_fp8"]
    rep = memory_report(parse_launch_args(doc["flags"] + _target(doc)).spec)
    assert not rep.fits
    assert rep.stages[0].allocated_peak_bytes > rep.device_bytes


def test_modelzoo_gb200_mxfp8_line_lands_near_its_published_throughput(tmp_path, capsys):
    """ModelZoo's Qwen3-235B MXFP8 line on 256 GB200 (fine-grained activation offloading,
    HybridEP, A2A overlap; not in the public set, never fitted), read by the drop-in as
    captured. Its table (best_practice/qwen3/readme.md, GB200) prints 919 TFLOP/s only;
    the BF16 row of the same table and sequence (P107 of the public set, 750 TFLOP/s)
    gives the tokens per TFLOP of that FLOP count."""
    from primus_ext.project.validate import measured_tokens
    from primus_ext.published import DEFAULT_PATH, read_runs
    p107 = {r.run_id: r for r in read_runs(DEFAULT_PATH)}["P107"]
    assert p107.measured["tflops_per_gpu"] == 750 and p107.spec.train.seq_length == 4096
    want = 919 * measured_tokens(p107)[0] / 750
    doc = SCRIPTS["zoo_qwen3_235b_gb200_mxfp8"]
    out = tmp_path / "p.json"
    assert main(doc["flags"] + _target(doc) + ["--project-only", "--projection-backend",
                                               "simulate", "--projection-out", str(out)]) == 0
    capsys.readouterr()
    est = json.loads(out.read_text())
    cfg = est["config"]
    assert (cfg["parallel"]["pp"], cfg["parallel"]["vpp"], cfg["parallel"]["ep"],
            cfg["train"]["micro_batch_size"], cfg["train"]["precision"]) == (4, 6, 64, 3, "fp8")
    assert cfg["train"]["offload_modules"] == ["expert_fc1", "moe_act"]
    assert abs(est["tokens_per_s_per_gpu"] / want - 1) <= 0.10
