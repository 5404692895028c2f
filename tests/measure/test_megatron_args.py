"""Megatron-LM flags -> RunSpec: defaults, round trip with the recipe emitter."""
from __future__ import annotations

import dataclasses

import pytest

from primus_ext import compose
from primus_ext.frameworks.megatron.flags import megatron_argv
from primus_ext.frameworks.megatron.args import parse_launch_args, parse_megatron_args, \
    warning_lines

BASE = ["--num-layers", "4", "--hidden-size", "256", "--num-attention-heads", "8",
        "--seq-length", "512", "--max-position-embeddings", "512", "--micro-batch-size",
        "1", "--global-batch-size", "8",
        "--target-hardware", "cpu", "--target-gpus-per-node", "2"]


@pytest.mark.parametrize("overrides", [
    ["model=tiny_dense", "cluster.hardware=cpu"],
    ["model=llama3.1_70b", "cluster.num_nodes=8", "parallel.tp=8", "parallel.pp=4",
     "parallel.vpp=2", "parallel.sequence_parallel=true"],
    ["model=mixtral_8x7b", "cluster.num_nodes=4", "parallel.ep=8", "parallel.tp=2",
     "parallel.sequence_parallel=true", "train.recompute_granularity=selective"],
    ["model=deepseek_v3", "cluster.num_nodes=128", "parallel.ep=64", "parallel.pp=16",
     "train.recompute_granularity=full", "train.recompute_method=uniform",
     "train.recompute_num_layers=1"],
    ["model=llama3.1_8b", "parallel.cp=2", "parallel.pp=2",
     "train.recompute_granularity=full", "train.recompute_method=block",
     "train.recompute_num_layers=2", "train.precision=fp8"],
    ["model=deepseek_v3", "cluster.num_nodes=128", "parallel.ep=64", "parallel.pp=16",
     "parallel.moe_token_dispatcher_type=flex", "parallel.grad_reduce_in_fp32=false",
     "train.precision=fp8",
     "train.cross_entropy_loss_fusion=true"],
    ["model=mixtral_8x7b", "cluster.num_nodes=2", "parallel.ep=8",
     "parallel.moe_token_dispatcher_type=alltoall",
     "parallel.overlap_moe_expert_parallel_comm=true", "train.precision=fp16"],
    ["model=llama3_8b", "parallel.cp=1", "train.precision=fp8",
     "train.fp8_param_gather=true", "parallel.grad_reduce_in_fp32=false", "train.te=true"],
    ["model=llama3_8b", "parallel.cp=1", "train.use_precision_aware_optimizer=true",
     "train.main_grads_dtype=bf16", "parallel.grad_reduce_in_fp32=false",
     "train.exp_avg_dtype=fp8", "train.exp_avg_sq_dtype=bf16", "train.te=false",
     # megatron-core's local spec runs only its unfused DotProductAttention
     "train.attention_backend=unfused"],
    ["model=mixtral_8x7b", "cluster.num_nodes=2", "parallel.ep=8",
     "train.offload_modules=[core_attn,attn_proj,expert_fc1]"],
    ["model=mixtral_8x7b", "cluster.num_nodes=2", "parallel.ep=8",
     "model.moe_expert_capacity_factor=1.25", "model.moe_pad_expert_input_to_capacity=true"],
])
def test_round_trip_with_the_recipe_emitter(overrides):
    spec = compose(overrides)
    argv = megatron_argv(spec) + ["--target-nodes", str(spec.cluster.num_nodes),
                                  "--target-hardware", spec.cluster.hardware.name]
    if spec.cluster.gpus_per_node:
        argv += ["--target-gpus-per-node", str(spec.cluster.gpus_per_node)]
    # Without a learned position table the recipe writes max(max_position_embeddings,
    # seq_length): Megatron-LM requires max_position_embeddings >= seq_length.
    from primus_ext.spec.legal_megatron import recipe_max_position_embeddings
    expected = dataclasses.replace(spec, model=dataclasses.replace(
        spec.model,
        max_position_embeddings=recipe_max_position_embeddings(spec.model, spec.train)))
    assert parse_megatron_args(argv, name=spec.model.name) == expected


def test_megatron_defaults_when_flags_are_absent():
    spec = parse_megatron_args(BASE)
    m, p, t = spec.model, spec.parallel, spec.train
    assert (m.normalization, m.activation, m.position_embedding_type) == (
        "LayerNorm", "gelu", "learned_absolute")
    assert m.add_bias_linear and not m.untie_embeddings_and_output_weights
    assert (m.hidden_dropout, m.attention_dropout) == (0.1, 0.1)
    assert not p.use_distributed_optimizer and not p.overlap_grad_reduce
    assert t.precision == "fp32" and t.recompute_granularity is None
    assert p.grad_reduce_in_fp32  # fp32 training reduces fp32 gradients
    assert spec.world_size == 2 and spec.cluster.hardware.name == "cpu"


def test_moe_and_gradient_flags_follow_megatron_lm_defaults():
    moe = BASE + ["--num-experts", "4", "--moe-router-topk", "2"]
    assert parse_megatron_args(moe).parallel.moe_token_dispatcher_type == "allgather"
    bf16 = parse_megatron_args(moe + ["--bf16"]).parallel
    assert bf16.grad_reduce_in_fp32 and not bf16.overlap_moe_expert_parallel_comm
    assert not parse_megatron_args(moe + ["--bf16", "--grad-reduce-in-bf16"]
                                   ).parallel.grad_reduce_in_fp32
    assert not parse_megatron_args(moe + ["--fp16"]).parallel.grad_reduce_in_fp32
    with pytest.raises(SystemExit):
        parse_megatron_args(moe + ["--moe-token-dispatcher-type", "deepep"])


def test_llama_style_flags():
    spec = parse_megatron_args(BASE + [
        "--swiglu", "--normalization", "RMSNorm", "--position-embedding-type", "rope",
        "--disable-bias-linear", "--untie-embeddings-and-output-weights",
        "--group-query-attention", "--num-query-groups", "2", "--ffn-hidden-size", "688",
        "--bf16", "--tensor-model-parallel-size", "2", "--sequence-parallel",
        "--use-distributed-optimizer", "--overlap-grad-reduce", "--mock-data",
        "--tokenizer-type", "NullTokenizer", "--vocab-size", "1023"])
    m = spec.model
    assert (m.activation, m.normalization, m.num_groups, m.vocab_size) == (
        "swiglu", "RMSNorm", 2, 1024)
    assert spec.parallel.tp == 2 and spec.parallel.sequence_parallel
    assert spec.train.precision == "bf16"


def test_moe_layer_freq_patterns():
    argv = BASE + ["--num-experts", "4", "--moe-router-topk", "2"]
    spec = parse_megatron_args(argv + ["--moe-layer-freq", "([0]*1+[1]*3)"])
    assert spec.model.moe_first_k_dense == 1 and spec.model.num_moe_layers == 3
    spec = parse_megatron_args(argv + ["--moe-layer-freq", "2"])
    assert spec.model.moe_layer_freq == 2 and spec.model.num_moe_layers == 2
    with pytest.raises(ValueError, match="moe-layer-freq"):
        parse_megatron_args(argv + ["--moe-layer-freq", "[1,1,0,1]"])


def test_virtual_stages_and_layout():
    argv = BASE[:-2] + ["--target-gpus-per-node", "4", "--num-layers", "8",
                        "--pipeline-model-parallel-size", "2"]
    spec = parse_megatron_args(argv + ["--num-layers-per-virtual-pipeline-stage", "2"])
    assert spec.parallel.vpp == 2
    spec = parse_megatron_args(argv + ["--pipeline-model-parallel-layout", "Et*3|t*5L"])
    assert spec.parallel.pipeline_layout == (3, 5)


def test_unmodelled_flags_are_ignored_with_one_warning():
    la = parse_launch_args(BASE + ["--data-path", "/data/x", "--save", "/ckpt", "--lr",
                                   "3e-4", "--project-only", "--target-nodes", "4"])
    assert la.project_only and la.spec.cluster.num_nodes == 4
    assert la.ignored == ("--data-path", "--save", "--lr")
    lines = warning_lines(la)  # data, checkpoint and lr flags: one "no effect" line
    assert len(lines) == 1 and lines[0].count("\n") == 0 and "--data-path" in lines[0]
    assert lines[0].startswith("primus-ext: no effect on step time or memory:")
    assert warning_lines(parse_launch_args(BASE)) == []


def test_errors_name_the_rule():
    with pytest.raises(ValueError, match="num_attention_heads=6 is not divisible by"):
        parse_megatron_args(BASE + ["--tensor-model-parallel-size", "4",
                                    "--num-attention-heads", "6",
                                    "--kv-channels", "32"])
