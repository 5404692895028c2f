"""The GPU paths of issue 21, one test per mechanism, each against byte counts derived
by hand from the megatron-core / Transformer Engine function the model follows (named
in each test). The golden comparison itself is tests/memory/test_memory_vs_golden.py."""
from __future__ import annotations

from dataclasses import replace

import pytest

from memory_specs import GPT, LLAMA, MOE, run

from primus_ext.frameworks.megatron.args import parse_megatron_args
from primus_ext.memory.activations import chunk_activations, layer_items
from primus_ext.memory.attn_unfused import softmax_kernel
from primus_ext.memory.dims import Dims
from primus_ext.memory.inflight import inflight_interleaved
from primus_ext.memory.options import MemoryOptions
from primus_ext.memory.overhead import other_items
from primus_ext.memory.report import memory_report, resolved_train
from primus_ext.presets import hardware_preset
from primus_ext.spec import ModelSpec

OPT = MemoryOptions()
MIB = 1 << 20
BASE = ["--num-layers", "4", "--hidden-size", "512", "--num-attention-heads", "8",
        "--seq-length", "1024", "--max-position-embeddings", "1024",
        "--micro-batch-size", "4", "--global-batch-size", "32", "--bf16",
        "--vocab-size", "50257", "--tokenizer-type", "NullTokenizer",
        "--target-nodes", "1", "--target-gpus-per-node", "8", "--target-hardware", "h100"]


def _items(spec, moe=False, **train_kw):
    train = replace(resolved_train(spec), **train_kw)
    return dict(layer_items(spec.model, spec.parallel, train, moe, OPT))


# ---- the layer stack and attention the flags select ---------------------------------
def test_local_spec_reads_as_megatron_cores_unfused_attention():
    """gpt_layer_specs.py get_gpt_layer_local_spec: core_attention=DotProductAttention;
    --attention-backend (default auto) only picks among TE's backends."""
    local = parse_megatron_args(BASE + ["--transformer-impl", "local"])
    assert local.train.te is False and local.train.attention_backend == "unfused"
    te = parse_megatron_args(BASE + ["--transformer-impl", "transformer_engine"])
    assert te.train.attention_backend == "flash"
    unfused = parse_megatron_args(BASE + ["--attention-backend", "unfused"])
    assert unfused.train.te is None and unfused.train.attention_backend == "unfused"


def test_unfused_attention_saves_two_bytes_per_score_with_the_fused_softmax():
    """The scale-mask-softmax kernel (TE softmax.py scaled_*_softmax_fwd, megatron-core
    fused_softmax.py ScaledUpperTriangMaskedSoftmax) saves its bf16 output only; dropout
    adds its bool mask and its bf16 output (bmm's input). The CPU preset runs the torch
    path instead: fp32 softmax output (4 B), the bf16 cast for bmm, the bool mask."""
    b, s, a = 1, 2048, 16
    scores = b * a * s * s
    spec = run(LLAMA)  # h100, no dropout
    for te in (True, False):
        it = _items(spec, te=te)
        assert it["softmax.output"] == scores * 2 and "softmax.cast" not in it
        assert "causal_mask" not in it
    gpt = run(GPT)  # attention dropout 0.1
    it = _items(gpt, te=True)
    assert it["attn_dropout.mask"] == scores and it["attn_dropout.output"] == scores * 2
    cpu = _items(spec, te=False, masked_softmax_fusion=False)
    assert cpu["softmax.output"] == scores * 4 and cpu["softmax.cast"] == scores * 2
    assert cpu["causal_mask"] == s * s


def test_softmax_kernel_key_length_ranges():
    """megatron-core: 16 < sk <= 4096; TE: 16 < sk < 16384 (is_kernel_available)."""
    def dims(s, te):
        return Dims(b=1, s=s, n=s, n_sp=s, tp=1, e=2, flash=False, te=te,
                    fused_softmax=True)
    assert softmax_kernel(dims(4096, False), 16) and not softmax_kernel(dims(8192, False), 16)
    assert softmax_kernel(dims(8192, True), 16) and not softmax_kernel(dims(16384, True), 16)
    assert not softmax_kernel(replace(dims(1024, True), e=4), 16)  # fp32: torch path


def test_te_unfused_mla_keeps_q_k_v_at_mla_head_dims():
    """MLA on TE unfused: q and k of qk_head_dim + qk_pos_emb_head_dim, v of
    v_head_dim (multi_latent_attention.py makes them contiguous), 2-byte scores."""
    mla = ModelSpec(name="mla", num_layers=2, hidden_size=1024, num_attention_heads=16,
                    ffn_hidden_size=2048, vocab_size=32000, multi_latent_attention=True,
                    q_lora_rank=384, kv_lora_rank=256, qk_head_dim=128,
                    qk_pos_emb_head_dim=64, v_head_dim=128)
    spec = run(mla, seq=1024, mbs=2)
    it = _items(spec, te=True)
    n = 2 * 1024
    assert it["q"] == it["k"] == n * 16 * 192 * 2 and it["v"] == n * 16 * 128 * 2
    assert it["softmax.output"] == 2 * 16 * 1024 * 1024 * 2
    assert "rope.cos_sin" not in it


def test_te_unfused_fp8_projection_saves_the_original_input():
    """megatron-core attention.py: set_save_original_input(linear_proj) for every FP8
    recipe but delayed, whatever the core attention; delayed keeps the FP8 copy."""
    spec = run(LLAMA, precision="fp8")
    n, a, hd = 2048, 16, 64
    assert _items(spec, te=True, fp8_recipe="tensorwise")["proj.input"] == n * a * hd * 2
    assert _items(spec, te=True, fp8_recipe="delayed")["proj.input"] == n * a * hd
    assert "core_attn.out" not in _items(spec, te=True, fp8_recipe="delayed")


def test_unfused_scores_are_a_forward_working_set():
    """baddbmm's output (the softmax input) lives beside the saved probabilities until
    the attention forward returns: a stage without the loss keeps one layer's scores."""
    spec = run(LLAMA, pp=2, gbs=64)
    train = resolved_train(spec)
    first = chunk_activations(LLAMA, spec.parallel, train, 0, 0, OPT)
    assert first.working_bytes == 1 * 16 * 2048 * 2048 * 2
    flash = chunk_activations(LLAMA, spec.parallel, replace(train, attention_backend="flash"),
                              0, 0, OPT)
    assert flash.working_bytes == 0


# ---- MoE -----------------------------------------------------------------------------
def test_gelu_experts_keep_the_probs_product():
    """mlp.py MLP.forward / experts.py bias_act_func: only SwiGLU / quick-GeGLU have a
    fused kernel with the routing probs; a GeLU expert runs activation, multiply and
    cast, and fc2 saves the product."""
    gelu_moe = replace(MOE, activation="gelu")
    spec = run(gelu_moe, ep=2)
    it = _items(spec, moe=True)
    assert it["experts.scaled_output"] == it["experts.act_output"]
    assert "experts.scaled_output" not in _items(run(MOE, ep=2), moe=True)


# ---- loss and output layer -----------------------------------------------------------
def test_deferred_embedding_wgrad_keeps_earlier_microbatches_outputs():
    """--defer-embedding-wgrad-compute --wgrad-deferral-limit L: the output layer keeps
    the logits' gradient and its input of up to L earlier microbatches
    (LinearWithGradAccumulationAndAsyncCommunication.backward grad_output_buffer,
    ColumnParallelLinear.forward embedding_activation_buffer)."""
    base = parse_megatron_args(BASE + ["--pipeline-model-parallel-size", "2"])
    limit2 = parse_megatron_args(BASE + ["--pipeline-model-parallel-size", "2",
                                         "--defer-embedding-wgrad-compute",
                                         "--wgrad-deferral-limit", "2"])
    every = parse_megatron_args(BASE + ["--pipeline-model-parallel-size", "2",
                                        "--defer-embedding-wgrad-compute"])
    assert limit2.train.wgrad_deferral_limit == 2 and base.num_microbatches == 2
    n, v, h = 4096, 50304, 512
    per_mb = n * v * 2 + n * h * 2
    act = [memory_report(s).stages[-1].activation_bytes for s in (base, limit2, every)]
    assert act[1] - act[0] == per_mb  # min(m - 1, 2) = 1 with 2 microbatches
    assert act[2] == act[1]
    with pytest.raises(ValueError, match="pipeline"):
        parse_megatron_args(BASE + ["--defer-embedding-wgrad-compute"])


# ---- non-model terms in the allocator ------------------------------------------------
def test_workspaces_follow_the_stack():
    """PyTorch: one cuBLAS workspace per (handle, stream), forward and autograd threads;
    TE: one GEMM workspace, four more for grouped GEMMs, three for userbuffers."""
    h100 = hardware_preset("h100")
    spec = run(LLAMA, tp=2, sequence_parallel=True)

    def ws(model, par, **train_kw):
        train = replace(resolved_train(spec), **train_kw)
        o = other_items(model, par, train, 4, 4, 0, OPT, h100)
        return o["cublas_workspaces"], o["te_workspaces"]
    assert ws(LLAMA, spec.parallel, te=True) == (2 * 32 * MIB, 32 * MIB + 1024)
    assert ws(LLAMA, spec.parallel, te=False) == (2 * 32 * MIB, 0)
    assert ws(MOE, spec.parallel, te=True)[1] == 5 * (32 * MIB + 1024)
    assert ws(MOE, replace(spec.parallel, moe_grouped_gemm=False), te=True)[1] == \
        32 * MIB + 1024
    ub = replace(spec.parallel, tp_comm_overlap=True)
    assert ws(LLAMA, ub, te=True)[1] == 4 * (32 * MIB + 1024)
    cpu = other_items(LLAMA, spec.parallel, resolved_train(spec), 4, 4, 0, OPT,
                      hardware_preset("cpu"))
    assert cpu["cublas_workspaces"] == cpu["te_workspaces"] == 0


def test_dummy_wgrads_one_per_linear_weight_shape():
    """TE base.py get_dummy_wgrad caches one tensor per (shape, dtype): with gradient
    accumulation fusion a TP-1 GPT stage holds qkv, proj, fc1, fc2 and the output
    layer's, once each, in bf16; none without it."""
    args = BASE + ["--untie-embeddings-and-output-weights"]
    on = memory_report(parse_megatron_args(args)).stages[0]
    off = memory_report(parse_megatron_args(args + ["--no-gradient-accumulation-fusion"]))
    h, v = 512, 50304
    shapes = h * 3 * h + h * h + h * 4 * h + 4 * h * h + v * h
    assert dict(on.other)["dummy_wgrads"] == shapes * 2
    assert dict(off.stages[0].other)["dummy_wgrads"] == 0


# ---- flags that change what is allocated ---------------------------------------------
def test_swiglu_ffn_default_is_megatron_lms():
    """megatron/training/arguments.py: --swiglu without --ffn-hidden-size takes
    int((4 * h * 2 / 3) / 64) * 64."""
    spec = parse_megatron_args(BASE + ["--swiglu"])
    assert spec.model.dense_ffn_size == int((4 * 512 * 2 / 3) / 64) * 64 == 1344


def test_distributed_optimizer_instances_shard_within_an_instance():
    """distributed_data_parallel.py: buffers and optimizer shards over the
    intra-instance group, dp / num_distributed_optimizer_instances ranks."""
    one = parse_megatron_args(BASE + ["--use-distributed-optimizer"])
    two = parse_megatron_args(BASE + ["--use-distributed-optimizer",
                                      "--num-distributed-optimizer-instances", "2"])
    assert two.parallel.num_distributed_optimizer_instances == 2
    o1 = memory_report(one).stages[0].optimizer_bytes
    o2 = memory_report(two).stages[0].optimizer_bytes
    assert 1.9 < o2 / o1 < 2.1


def test_implementation_flags_are_read():
    moe = BASE + ["--num-experts", "4", "--moe-router-topk", "2"]
    assert parse_megatron_args(moe + ["--moe-grouped-gemm"]).parallel.moe_grouped_gemm
    assert not parse_megatron_args(moe).parallel.moe_grouped_gemm
    t = parse_megatron_args(BASE + ["--no-masked-softmax-fusion",
                                    "--no-gradient-accumulation-fusion"]).train
    assert t.masked_softmax_fusion is False and t.gradient_accumulation_fusion is False


def test_interleaving_with_microbatches_not_divisible_by_pp_runs_one_group():
    """megatron-core rejects a short last microbatch group: m % pp != 0 runs with
    microbatch_group_size_per_vp_stage = m (as project/estimate.py schedules it)."""
    spec = run(replace(LLAMA, num_layers=12), pp=4, vpp=3, gbs=40, gpus=8, nodes=1)
    assert spec.num_microbatches == 20 and spec.num_microbatches % 4 == 0
    spec = run(replace(LLAMA, num_layers=12), pp=4, vpp=3, gbs=10, gpus=8, nodes=1)
    m = spec.num_microbatches
    assert m % 4
    rep = memory_report(spec)
    per = tuple(chunk_activations(spec.model, spec.parallel, resolved_train(spec), 3, c,
                                  OPT).bytes_per_microbatch for c in range(3))
    assert rep.stages[3].inflight_per_chunk == inflight_interleaved(4, 3, 3, m, per, m)
