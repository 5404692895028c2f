"""Megatron-LM's legal space (spec/legal_megatron.py) against Megatron-LM's own verdicts.

tests/data/megatron_lm_verdicts/ holds what Megatron-LM core_v0.16.1's parse_args +
validate_args said about real lines (scripts/megatron_lm_verdicts.py; README there): the
recipes primus-ext writes and variants of them. The rule table must refuse exactly the
refused ones, with Megatron-LM's reason, and the drop-in must derive the same layout as
Megatron-LM for the accepted ones.
"""
from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from primus_ext import compose
from primus_ext.frameworks.megatron.args import _parser, parse_launch_args
from primus_ext.frameworks.megatron.flags import megatron_argv, torchrun_script
from primus_ext.frameworks.megatron.line_rules import line_args
from primus_ext.spec.legal_megatron import RULES, required_env, violations
from primus_ext.tune.settings import SpaceSettings
from primus_ext.tune.space import SearchSpace

DATA = Path(__file__).parents[1] / "data" / "megatron_lm_verdicts"
CASES = sorted(DATA.glob("*.json"))


def _case(path: Path) -> dict:
    return json.loads(path.read_text())


def _our_violations(case: dict) -> list[str]:
    ns, unknown = _parser().parse_known_args([str(f) for f in case["flags"]])
    args = line_args(ns, unknown)
    args["env"] = case.get("env", {})
    return violations(args)


def _plain(msg: str) -> str:
    """Megatron-LM's message without the values it formats in."""
    return re.sub(r"\s*\(\d+\)", "", msg).strip().rstrip(".")


def test_the_captured_verdicts_cover_both_answers():
    verdicts = [_case(p)["verdict"] for p in CASES]
    assert verdicts.count("accepted") >= 5 and verdicts.count("refused") >= 10


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_the_rules_refuse_what_megatron_refuses_with_its_reason(path):
    case = _case(path)
    ours = _our_violations(case)
    if case["verdict"] == "accepted":
        assert ours == [], ours
    else:
        assert ours, f"Megatron-LM refused it: {case['message']}"
        assert any(_plain(case["message"]) in o for o in ours), (case["message"], ours)


@pytest.mark.parametrize("path", [p for p in CASES if _case(p)["verdict"] == "accepted"],
                         ids=lambda p: p.stem)
def test_the_drop_in_derives_megatrons_layout(path):
    case = _case(path)
    la = parse_launch_args([str(f) for f in case["flags"]] + [
        "--target-nodes", str(case["nnodes"]), "--target-gpus-per-node",
        str(case["nproc"]), "--target-hardware", "h100"])
    s, d = la.spec, case["derived"]
    p = s.parallel
    ours = (p.tp, p.pp, p.vpp, p.cp, p.ep, p.expert_tp, s.dp, s.train.micro_batch_size,
            s.train.global_batch_size, s.num_microbatches, s.train.seq_length)
    theirs = (d["tensor_model_parallel_size"], d["pipeline_model_parallel_size"],
              d["virtual_pipeline_model_parallel_size"] or 1, d["context_parallel_size"],
              d["expert_model_parallel_size"], d["expert_tensor_parallel_size"],
              d["data_parallel_size"], d["micro_batch_size"], d["global_batch_size"],
              d["num_microbatches"], d["seq_length"])
    assert ours == theirs
    # The sharding Megatron-LM runs is the one projected.
    assert (p.fsdp and p.fsdp_impl == "torch_fsdp2") == d["use_torch_fsdp2"]
    assert (p.fsdp and p.fsdp_impl == "megatron_fsdp") == d["use_megatron_fsdp"]
    if s.model.multi_latent_attention:
        assert s.model.kv_lora_rank == d["kv_lora_rank"]


def test_every_rule_cites_a_line_of_validate_args_and_says_its_reason():
    assert len({r.name for r in RULES}) == len(RULES)
    for r in RULES:
        assert 290 < r.line < 1100 and len(r.message) > 20


def _emitted_line_violations(spec) -> list[str]:
    ns, unknown = _parser().parse_known_args(megatron_argv(spec))
    args = line_args(ns, unknown)
    script = torchrun_script(spec)
    args["env"] = dict(re.findall(r"^export (CUDA_DEVICE_MAX_CONNECTIONS)=(\S+)$", script,
                                  re.M))
    return violations(args)


@pytest.mark.parametrize("overrides,sharding", [
    (["model=deepseek_v3", "cluster.hardware=h100", "cluster.num_nodes=64",
      "train.global_batch_size=4096"],
     ("distributed_optimizer", "fsdp", "torch_fsdp2", "none")),
    (["model=llama3_8b", "cluster.hardware=h100", "cluster.num_nodes=2",
      "model.untie_embeddings_and_output_weights=true"],
     ("distributed_optimizer", "fsdp", "torch_fsdp2", "none")),
])
def test_every_legal_candidate_writes_a_line_megatron_takes(overrides, sharding):
    base = compose(overrides)
    space = SearchSpace(base, SpaceSettings(values={
        "sharding": sharding, "tp": (1, 2, 8), "pp": (1, 4, 8), "cp": (1, 2),
        "micro_batch_size": (1,), "recompute_granularity": ("selective",)}))
    points = space.legal_points()
    assert points
    seen_shardings = set()
    for point in points[::max(1, len(points) // 150)]:
        spec = space.spec(point)
        seen_shardings.add(point[space_axis("sharding")])
        assert _emitted_line_violations(spec) == [], (point, megatron_argv(spec))
    assert {"distributed_optimizer", "fsdp"} <= seen_shardings


def space_axis(name: str) -> int:
    from primus_ext.tune.points import IDX
    return IDX[name]


def test_torch_fsdp2_is_refused_where_megatron_refuses_it():
    base = compose(["model=deepseek_v3", "cluster.hardware=h100", "cluster.num_nodes=64",
                    "train.global_batch_size=4096"])
    par = dataclasses.replace(base.parallel, fsdp=True, fsdp_impl="torch_fsdp2", pp=1,
                              vpp=1, ep=8, decoder_first_pipeline_num_layers=None,
                              decoder_last_pipeline_num_layers=None, pipeline_layout=None)
    with pytest.raises(ValueError, match="not supported with expert parallelism"):
        dataclasses.replace(base, parallel=par)
    # Megatron-FSDP takes the same layout.
    dataclasses.replace(base, parallel=dataclasses.replace(par, fsdp_impl="megatron_fsdp"))


def test_the_recipe_exports_what_megatron_requires():
    tp2 = compose(["model=llama3_8b", "cluster.hardware=h100", "parallel.tp=2",
                   "parallel.sequence_parallel=true"])
    assert "export CUDA_DEVICE_MAX_CONNECTIONS=1" in torchrun_script(tp2)
    fsdp = compose(["model=llama3_8b", "cluster.hardware=h100", "parallel.tp=2",
                    "parallel.sequence_parallel=true", "parallel.fsdp=true"])
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in torchrun_script(fsdp)
    argv = megatron_argv(fsdp)
    assert "--use-megatron-fsdp" in argv and "--use-torch-fsdp2" not in argv
    assert argv[argv.index("--ckpt-format") + 1] == "fsdp_dtensor"
    assert required_env({"tensor_model_parallel_size": 1}) == {}


def test_deepseek_v3_writes_its_kv_lora_rank_and_max_positions():
    spec = compose(["model=deepseek_v3", "cluster.hardware=h100", "cluster.num_nodes=64",
                    "train.global_batch_size=4096"])
    argv = megatron_argv(spec)
    # Megatron-LM's --kv-lora-rank default is 32: DeepSeek-V3's 512 must be written.
    assert argv[argv.index("--kv-lora-rank") + 1] == "512"
    assert int(argv[argv.index("--max-position-embeddings") + 1]) >= \
        spec.train.seq_length
