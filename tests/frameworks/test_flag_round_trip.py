"""emit -> parse is the identity on the specs Megatron-LM flags can express.

Random legal RunSpecs (model shape, MoE, MLA/MTP, every parallel degree and layout
flavour Megatron-LM names, precision, recompute, optimizer dtypes) are written with
``megatron_argv`` and read back with ``parse_launch_args``: the same spec must come
back, and no written flag may be reported as unknown.
"""
from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from primus_ext.frameworks.megatron.args import parse_launch_args
from primus_ext.spec.legal_megatron import (recipe_max_position_embeddings,
                                            recipe_overlap_param_gather)
from primus_ext.frameworks.megatron.flags import megatron_argv
from primus_ext.presets import hardware_preset
from primus_ext.spec import ClusterSpec, ModelSpec, ParallelSpec, RunSpec, TrainSpec


def _moe_impl(draw) -> dict:
    """The MoE kernel and module choices a launch line states."""
    terms = draw(st.sets(st.sampled_from(("aux_loss", "z_loss", "input_jitter",
                                          "topk_scaling", "padding",
                                          "per_layer_logging"))))
    if draw(st.booleans()):
        terms |= {"sigmoid", "expert_bias"} if draw(st.booleans()) else {"sigmoid"}
    balancing = draw(st.sampled_from(("aux_loss", "seq_aux_loss", "global_aux_loss",
                                      "sinkhorn")))
    if balancing == "sinkhorn":
        terms.discard("aux_loss")
    return dict(moe_grouped_gemm=draw(st.booleans()),
                moe_permute_fusion=draw(st.booleans()),
                moe_router_fusion=draw(st.booleans()),
                moe_router_load_balancing_type=balancing, moe_router_terms=tuple(terms))


@st.composite
def _model(draw) -> ModelSpec:
    heads = draw(st.sampled_from((4, 8, 16)))
    head_dim = draw(st.sampled_from((16, 32)))
    moe = draw(st.booleans())
    mla = draw(st.booleans()) and moe
    kw = {}
    if moe:
        experts = draw(st.sampled_from((4, 8)))
        kw.update(num_moe_experts=experts, moe_router_topk=draw(st.sampled_from((1, 2))),
                  moe_ffn_hidden_size=draw(st.sampled_from((None, 64))),
                  moe_shared_expert_intermediate_size=draw(st.sampled_from((None, 64))),
                  moe_layer_freq=draw(st.sampled_from((1, 2))),
                  moe_first_k_dense=draw(st.sampled_from((0, 1))),
                  moe_expert_capacity_factor=draw(st.sampled_from((None, 1.0, 1.5))))
        kw["moe_pad_expert_input_to_capacity"] = bool(
            kw["moe_expert_capacity_factor"]) and draw(st.booleans())
        if draw(st.booleans()):
            kw.update(moe_router_num_groups=2, moe_router_group_topk=1,
                      moe_router_topk=min(kw["moe_router_topk"], experts // 2))
    if mla:
        kw.update(multi_latent_attention=True, q_lora_rank=draw(st.sampled_from((None, 32))),
                  kv_lora_rank=32, qk_head_dim=16, qk_pos_emb_head_dim=8, v_head_dim=16,
                  mtp_num_layers=draw(st.sampled_from((0, 1))))
    groups = draw(st.sampled_from((None, heads // 2, heads)))
    activation = draw(st.sampled_from(("swiglu", "gelu", "squared_relu", "quick_geglu")))
    ffn = draw(st.sampled_from((None, 96, 256)))
    if ffn is None and activation == "swiglu":
        # Megatron-LM's default FFN width with --swiglu is 2/3 of 4 x hidden: a SwiGLU
        # spec at 4 x hidden is written (and read back) with --ffn-hidden-size.
        ffn = 4 * heads * head_dim
    window = draw(st.sampled_from((None, 64)))
    every = draw(st.sampled_from((1, 2))) if window else 1
    return ModelSpec(
        name="m", num_layers=draw(st.sampled_from((4, 6, 8, 12))),
        hidden_size=heads * head_dim, num_attention_heads=heads,
        ffn_hidden_size=ffn, num_query_groups=groups,
        kv_channels=draw(st.sampled_from((None, head_dim))),
        vocab_size=draw(st.integers(1000, 70000)),
        make_vocab_size_divisible_by=draw(st.sampled_from((1, 64, 128))),
        max_position_embeddings=draw(st.sampled_from((256, 1024))),
        normalization=draw(st.sampled_from(("RMSNorm", "LayerNorm"))),
        activation=activation,
        add_bias_linear=draw(st.booleans()), add_qkv_bias=draw(st.booleans()),
        qk_layernorm=draw(st.booleans()),
        position_embedding_type=draw(st.sampled_from(("rope", "learned_absolute", "none"))
                                     ) if not kw.get("mtp_num_layers") else "rope",
        untie_embeddings_and_output_weights=draw(st.booleans()),
        hidden_dropout=draw(st.sampled_from((0.0, 0.1))),
        attention_dropout=draw(st.sampled_from((0.0, 0.1))),
        window_size=window, window_full_attention_every=every, **kw)


@st.composite
def _spec(draw) -> RunSpec:
    model = draw(_model())
    tp, pp, cp = (draw(st.sampled_from(v)) for v in ((1, 2), (1, 2, 4), (1, 2)))
    vpp = draw(st.sampled_from((1, 2))) if pp > 1 else 1
    ep = draw(st.sampled_from((1, 2, 4))) if model.is_moe else 1
    fsdp = draw(st.booleans())
    dist_opt = draw(st.booleans()) and not fsdp
    precision = draw(st.sampled_from(("bf16", "fp16", "fp8", "fp32")))
    uneven = draw(st.sampled_from(("none", "first_last", "emb_loss", "explicit")))
    layout = {}
    L = model.num_layers
    if pp > 1 and uneven == "first_last" and vpp == 1:
        layout = dict(decoder_first_pipeline_num_layers=1)
    elif pp > 1 and uneven == "emb_loss":
        layout = dict(account_for_embedding_in_pipeline_split=True,
                      account_for_loss_in_pipeline_split=True)
    elif pp > 1 and uneven == "explicit":
        nv = pp * vpp
        counts = [L // nv] * nv
        counts[-1] += L - sum(counts)
        if counts[0] > 0:  # uneven on purpose: an even list is the default placement
            counts[0] -= 1
            counts[-1] += 1
        layout = dict(pipeline_layout=tuple(counts))
    par = ParallelSpec(
        tp=tp, pp=pp, vpp=vpp, cp=cp, ep=ep,
        etp=draw(st.sampled_from((None, 1))) if model.is_moe and tp > 1 else None,
        sequence_parallel=tp > 1 and (model.is_moe or draw(st.booleans())),
        use_distributed_optimizer=dist_opt, fsdp=fsdp,
        overlap_grad_reduce=draw(st.booleans()),
        overlap_param_gather=draw(st.booleans()) and (dist_opt or fsdp),
        grad_reduce_in_fp32=draw(st.booleans()) if precision != "fp32" else True,
        moe_token_dispatcher_type=draw(st.sampled_from(("alltoall", "allgather", "flex")))
        if model.is_moe else ParallelSpec().moe_token_dispatcher_type,
        cp_comm_type=draw(st.sampled_from(("p2p", "a2a", "allgather"))), **layout,
        **(_moe_impl(draw) if model.is_moe else {}))
    if par.tp > 1 and par.sequence_parallel:
        par = dataclasses.replace(par, tp_comm_overlap=draw(st.booleans()))
    if par.moe_token_dispatcher_type == "flex":
        par = dataclasses.replace(par, moe_flex_num_sms=draw(st.sampled_from((None, 24, 32))))
    gran = draw(st.sampled_from((None, "selective", "full")))
    rec = {}
    if gran == "full":
        rec = dict(recompute_method=draw(st.sampled_from(("uniform", "block"))),
                   recompute_num_layers=1)
    elif gran == "selective":
        rec = dict(recompute_modules=draw(st.sampled_from(
            (("core_attn",), ("core_attn", "mlp"), ("layernorm", "moe_act")))))
    pao = draw(st.booleans())
    dt = (draw(st.sampled_from(("fp32", "bf16"))), draw(st.sampled_from(("fp32", "bf16"))),
          draw(st.sampled_from(("fp32", "fp8")))) if pao else ("fp32",) * 3
    if dt[0] == "bf16" and precision != "fp32":
        # Megatron-LM: bf16 main gradients are not accumulated and reduced in fp32 (and
        # --accumulate-allreduce-grads-in-fp32 refuses them)
        par = dataclasses.replace(par, grad_reduce_in_fp32=False)
    mbs = draw(st.sampled_from((1, 2)))
    fused_ce = draw(st.booleans())
    te = draw(st.sampled_from((None, True, False)))
    # megatron-core's local spec runs only its unfused DotProductAttention: a local run
    # with flash attention is not a line Megatron-LM can be given.
    backend = "unfused" if te is False else draw(st.sampled_from(("flash", "unfused")))
    world = 64
    dp = world // (tp * pp * cp)
    train = TrainSpec(
        seq_length=draw(st.sampled_from((256, 512))), micro_batch_size=mbs,
        global_batch_size=mbs * dp * draw(st.sampled_from((4, 8))), precision=precision,
        fp8_recipe=draw(st.sampled_from(("delayed", "tensorwise", "blockwise")))
        if precision == "fp8" else TrainSpec().fp8_recipe,
        fp8_param_gather=precision == "fp8" and draw(st.booleans()),
        recompute_granularity=gran, **rec,
        attention_backend=backend,
        # Megatron-LM refuses torch FSDP2 with gradient accumulation fusion: the flag is
        # always written there and the field keeps its default.
        gradient_accumulation_fusion=draw(st.booleans()) or fsdp,
        masked_softmax_fusion=draw(st.sampled_from((None, False))),
        optimizer=draw(st.sampled_from(("adam", "sgd"))),
        cross_entropy_loss_fusion=fused_ce,
        cross_entropy_fusion_impl=draw(st.sampled_from(("native", "te")))
        if fused_ce else "native",
        cpu_offloading_num_layers=draw(st.sampled_from((0, 1, 3)))
        if pp == 1 and gran is None else 0,
        te=te,
        use_precision_aware_optimizer=pao, main_grads_dtype=dt[0], exp_avg_dtype=dt[1],
        exp_avg_sq_dtype=dt[2],
        moe_router_dtype=draw(st.sampled_from((None, "fp32"))) if model.is_moe else None,
        moe_router_force_load_balancing=model.is_moe and draw(st.booleans()),
        offload_modules=draw(st.sampled_from(((), ("core_attn", "attn_proj"),
                                              ("qkv_linear", "mlp_norm")))))
    cluster = ClusterSpec(hardware=hardware_preset("h100"), num_nodes=world // 8)
    return RunSpec(model=model, parallel=par, train=train, cluster=cluster)


def _legal_spec(data) -> RunSpec:
    try:
        spec = data.draw(_spec())
        spec.layout  # noqa: B018 -- raises on an illegal layout
    except ValueError:
        assume(False)
    if spec.layout.how == "balanced" and spec.parallel.pipeline_layout is None:
        assume(False)  # the tuner writes these as a layout string; covered below
    # Without a learned position table the recipe raises --max-position-embeddings to
    # the sequence length (Megatron-LM requires max_position_embeddings >= seq_length).
    # --overlap-param-gather only where Megatron-LM takes it (with --overlap-grad-reduce
    # and the distributed optimizer or Megatron-FSDP).
    mpe = recipe_max_position_embeddings(spec.model, spec.train)
    return dataclasses.replace(
        spec, model=dataclasses.replace(spec.model, max_position_embeddings=mpe),
        parallel=dataclasses.replace(
            spec.parallel, overlap_param_gather=recipe_overlap_param_gather(spec.parallel)))


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_emit_then_parse_gives_the_spec_back(data):
    spec = _legal_spec(data)
    argv = megatron_argv(spec) + ["--target-nodes", str(spec.cluster.num_nodes),
                                  "--target-hardware", "h100"]
    la = parse_launch_args(argv, name=spec.model.name)
    assert la.spec == spec, argv
    assert la.not_modelled == (), la.not_modelled  # every written flag is read


def test_a_balanced_layout_is_written_as_a_layout_string_and_read_back():
    from primus_ext import compose
    spec = compose(["model=deepseek_v3", "cluster.num_nodes=128", "parallel.ep=64",
                    "parallel.pp=16"])
    assert spec.layout.how == "balanced"
    argv = megatron_argv(spec)
    assert "--pipeline-model-parallel-layout" in argv
    back = parse_launch_args(argv + ["--target-nodes", "128"], name=spec.model.name).spec
    assert back.layout.layers_per_virtual_stage == spec.layout.layers_per_virtual_stage


@pytest.mark.parametrize("flag", ["--fp8-recipe", "--moe-token-dispatcher-type",
                                  "--attention-backend", "--optimizer", "--cp-comm-type",
                                  "--position-embedding-type"])
def test_megatron_defaults_are_not_written(flag):
    """Defect 7: a flag equal to Megatron-LM's default is not written into a recipe."""
    from primus_ext import compose
    spec = compose(["model=mixtral_8x7b", "cluster.num_nodes=2", "parallel.ep=8",
                    "parallel.moe_token_dispatcher_type=allgather",
                    "train.precision=fp8", "train.fp8_recipe=delayed",
                    "model.position_embedding_type=learned_absolute"])
    assert flag not in megatron_argv(spec)
