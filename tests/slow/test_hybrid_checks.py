"""What the hybrid run captures equals what the models count, for TP2+SP, EP2 and PP2.

Two CPU processes (gloo, one thread each) run ``launch/pretrain_gpt.py --project-only``
on a tiny model for an H100 target: the downscaled megatron-core run is real, its
collectives are traced with bytes and its saved activations counted. Per layer kind the
captured collective bytes must equal the simulate backend's ``CommOp.num_bytes`` of the
measured layout, the activation bytes the memory model's (plus the named CPU-only norm
delta), the executed FLOPs the simulate backend's, and the pipeline probe's send the comm
model's p2p bytes; the output must say
which parts were measured and which simulated.
"""
from __future__ import annotations

import importlib.util
import pathlib

import pytest

pytest.importorskip("torch")
pytest.importorskip("megatron.core")

from primus_ext.measure.checks import activation_check, collective_check, flops_check, \
    p2p_check  # noqa: E402
from primus_ext.frameworks.megatron.args import parse_megatron_args  # noqa: E402
from primus_ext.project.profile import Profile  # noqa: E402

pytestmark = pytest.mark.slow

_spec = importlib.util.spec_from_file_location(
    "hybrid_launch", pathlib.Path(__file__).with_name("hybrid_launch.py"))
H = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(H)

TARGET = ["--project-only", "--target-nodes", "1", "--target-gpus-per-node", "8",
          "--target-hardware", "h100", "--global-batch-size", "16",
          "--measure-warmup", "1", "--measure-repeats", "1"]
CASES = {
    "tp2_sp": (["--tensor-model-parallel-size", "2", "--sequence-parallel"], "tp"),
    "ep2": (["--num-experts", "4", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "128",
             "--moe-token-dispatcher-type", "alltoall", "--expert-model-parallel-size", "2"],
            "ep"),
    # No dispatcher flag: Megatron-LM's default, allgather.
    "ep2_allgather": (["--num-experts", "4", "--moe-router-topk", "2",
                       "--moe-ffn-hidden-size", "128", "--expert-model-parallel-size", "2"],
                      "ep"),
    "pp2": (["--pipeline-model-parallel-size", "2"], "pp"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_captured_bytes_equal_the_models(name, tmp_path):
    flags, axis = CASES[name]
    path = tmp_path / "profile.json"
    argv = H.TINY + flags + TARGET + ["--profile-out", str(path)]
    res = H.torchrun(argv)
    assert res.returncode == 0, res.stderr[-3000:]
    out = res.stdout
    assert "measured: ops, collectives with bytes per layer" in out
    assert "simulated: compute times (h100 model)" in out
    target = parse_megatron_args(argv)
    prof = Profile.load(path)
    rows = collective_check(prof, target)
    acts = activation_check(prof, target)
    assert acts and all(r["status"] == "match" for r in acts), acts
    if axis == "pp":
        rows += p2p_check(prof, target)
    flops = flops_check(prof, target)
    assert flops and all(r["status"] == "match" for r in flops), flops
    assert any(r.get("axis") == axis for r in rows), rows
    if axis == "ep":  # the routers' choices: 4 experts, top-2 of 128 tokens per rank
        want = "allgather" if name.endswith("allgather") else "alltoall"
        assert target.parallel.moe_token_dispatcher_type == want
        loads = prof.layers["moe"].expert_loads
        assert loads and all(len(v) == 4 and sum(v) == 2 * 128 for v in loads), loads
        assert any(r["payload"] == "metadata" for r in rows), rows
    bad = [r for r in rows if r["status"] != "match"]
    assert not bad, bad


def test_modelzoo_qwen3_moe_line_measures_and_its_activations_match(tmp_path):
    """ModelZoo's Qwen3-30B-A3B line, as captured (q/k norms, fp32 routing, TE layers,
    recompute of moe_act and layernorm): the default backend measures it on one process
    (moe_act left out of the sequential experts, and said), and the saved activations of
    the local-spec layer it built equal the memory model's plus the named CPU delta."""
    import json
    doc = json.loads((H.ROOT / "tests" / "data" / "launch_scripts"
                      / "zoo_qwen3_30b_1node.json").read_text())
    t = doc["target"]
    path = tmp_path / "profile.json"
    argv = doc["flags"] + ["--project-only", "--target-nodes", str(t["nodes"]),
                           "--target-gpus-per-node", str(t["gpus_per_node"]),
                           "--target-hardware", t["hardware"], "--profile-out", str(path)]
    res = H.torchrun(argv, nproc=1, timeout=900)
    H.skip_if_the_plan_finds_this_cpu_too_slow(res)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "recompute_moe_act: not built in the measured model" in res.stdout
    target = parse_megatron_args(argv)
    prof = Profile.load(path)
    acts = activation_check(prof, target)
    assert acts and all(r["status"] == "match" and r["cpu_delta"] > 0 for r in acts), acts
    flops = flops_check(prof, target)
    assert flops and all(r["status"] == "match" for r in flops), flops
