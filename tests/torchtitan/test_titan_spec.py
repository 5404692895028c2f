"""framework=torchtitan specs: composition, torchtitan's layout rules, its pipeline split."""
import pytest

import primus_ext
from primus_ext.spec.torchtitan import stage_layer_counts

BASE = ["framework=torchtitan", "model=llama3_8b", "cluster.hardware=h100",
        "cluster.num_nodes=4"]


def test_compose_resolves_dp_shard_and_keeps_megatron_default():
    spec = primus_ext.compose(BASE + ["parallel.dp_shard=-1", "parallel.tp=2"])
    assert spec.framework == "torchtitan"
    assert spec.dp == 16  # dp_replicate * dp_shard = 32 / tp
    assert spec.parallel.sequence_parallel  # torchtitan's enable_sequence_parallel
    assert primus_ext.compose(["model=llama3_8b"]).framework == "megatron"


@pytest.mark.parametrize("overrides, rule", [
    (["parallel.dp_shard=3"], "ParallelDims._validate"),
    (["parallel.dp_shard=0"], "must be -1 or >= 1"),
    (["parallel.tp_comm_overlap=true", "parallel.tp=2"], "CompileConfig"),
    (["parallel.pp=2", "parallel.schedule=Interleaved1F1B"], "at least 2 stages per rank"),
    (["parallel.pp=2", "parallel.vpp=2", "parallel.schedule=1F1B"], "exactly 1 stage"),
    (["parallel.pp=2", "parallel.schedule=LoopedBFS", "parallel.vpp=2"], "does not model"),
    (["train.global_batch_size=40"], "multiple of local batch size times"),
    (["parallel.pp=4", "parallel.vpp=2", "parallel.schedule=Interleaved1F1B",
      "train.global_batch_size=16"], "needs num_microbatches >= pp"),
    (["train.recompute_granularity=selective"], "train.activation_checkpoint"),
    (["train.activation_checkpoint=op"], "must be one of 'none', 'selective', 'full'"),
    (["train.compile=maybe"], "must be a boolean"),
])
def test_torchtitan_rules_are_named(overrides, rule):
    with pytest.raises(ValueError, match=rule.replace("(", r"\(").replace(".", r"\.")):
        primus_ext.compose(BASE + overrides)


def test_megatron_rejects_torchtitan_only_fields():
    for o in ("parallel.dp_shard=8", "parallel.dp_replicate=2",
              "train.activation_checkpoint=full", "train.compile=true"):
        with pytest.raises(ValueError, match="framework=torchtitan"):
            primus_ext.compose(["model=llama3_8b", o])


def test_ep_borrows_from_dp_shard_cp_tp():
    base = ["framework=torchtitan", "model=mixtral_8x7b", "cluster.hardware=h100",
            "cluster.num_nodes=1"]
    assert primus_ext.compose(base + ["parallel.ep=8"]).parallel.ep == 8
    with pytest.raises(ValueError, match="efsdp"):
        primus_ext.compose(base + ["parallel.ep=8", "parallel.pp=2",
                                   "parallel.schedule=1F1B"])


def test_stage_split_matches_torchtitan_by_hand():
    # 32 layers + embedding + output = 34 effective over 4 stages: 9, 9, 8, 8; the
    # first and last give one to the embedding / output.
    assert stage_layer_counts(4, 32) == (8, 9, 8, 7)
    assert stage_layer_counts(2, 6) == (3, 3)
    assert stage_layer_counts(1, 6) == (6,)
    with pytest.raises(ValueError, match="_generate_llm_fqn_per_model_part"):
        stage_layer_counts(8, 4)


@pytest.mark.parametrize("stages, layers", [(2, 6), (4, 32), (8, 80), (16, 126), (3, 7)])
def test_stage_split_matches_torchtitan_code(stages, layers):
    pp_mod = pytest.importorskip("torchtitan.distributed.pipeline_parallel")
    parts = pp_mod._generate_llm_fqn_per_model_part(stages, layers)
    real = tuple(sum(1 for n in p if n.startswith("layers.")) for p in parts)
    assert stage_layer_counts(stages, layers) == real


def _cli(*args):
    import json
    import os
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-m", "primus_ext.cli", *args], capture_output=True,
                       text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    return r, (json.loads(r.stdout) if r.returncode == 0 else None)


def test_cli_projects_and_reports_memory_for_torchtitan():
    job = ["framework=torchtitan", "model=llama3_8b", "cluster.hardware=h100",
           "cluster.num_nodes=4", "parallel.dp_shard=-1", "parallel.tp=2", "output=json"]
    r, est = _cli(*job)
    assert r.returncode == 0, r.stderr
    assert est["tokens_per_s_per_gpu"] > 0 and est["notes"][0].startswith("framework: torchtitan")
    r, mem = _cli("mode=memory", *job)
    assert r.returncode == 0, r.stderr
    assert mem["peak_bytes"] == est["peak_memory_bytes"]
    r, _ = _cli("framework=torchtitan", "model=llama3_8b", "parallel.dp_shard=3")
    assert r.returncode != 0 and "ParallelDims._validate" in r.stderr


def test_override_lists_carry_the_framework():
    from primus_ext.presets.overrides import apply_overrides, spec_from_overrides, \
        spec_overrides
    spec = primus_ext.compose(BASE + ["parallel.tp=2", "train.compile=true"])
    ovs = spec_overrides(spec)
    assert ovs[0] == "framework=torchtitan"
    assert spec_from_overrides(ovs) == spec
    assert apply_overrides(spec, ["parallel.tp=4"]).framework == "torchtitan"
    assert primus_ext.compose(ovs) == spec
