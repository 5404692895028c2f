"""Every validation rule of the specs: a failing case whose ValueError names the field(s),
and a passing case beside it; then property tests over random layouts."""
from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from primus_ext.presets import hardware_preset, model_preset
from primus_ext.spec import (ClusterSpec, ModelSpec, ParallelSpec, RunSpec, TrainSpec,
                             pipeline_layout)

H100 = hardware_preset("h100")
DENSE = ModelSpec(name="dense", num_layers=8, hidden_size=256, num_attention_heads=8,
                  num_query_groups=4, vocab_size=1024)
MOE = ModelSpec(**model_preset("tiny_moe"))
LLAMA405 = ModelSpec(**model_preset("llama3.1_405b"))
DSV3 = ModelSpec(**model_preset("deepseek_v3"))


def make(model=DENSE, *, gpus=8, seq=4096, mbs=1, gbs=None, train=None, **par) -> RunSpec:
    """A RunSpec on `gpus` H100s (whole 8-GPU nodes, or one partial node)."""
    nodes, per_node = (gpus // 8, None) if gpus % 8 == 0 else (1, gpus)
    cluster = ClusterSpec(hardware=H100, num_nodes=nodes, gpus_per_node=per_node)
    parallel = ParallelSpec(**par)
    if gbs is None:
        dp = max(gpus // parallel.model_parallel_size, 1)
        gbs = mbs * dp * 8 * parallel.pp
    train = train or TrainSpec(seq_length=seq, micro_batch_size=mbs, global_batch_size=gbs)
    return RunSpec(model=model, parallel=parallel, train=train, cluster=cluster)


def fails(match: str, fn, *args, **kwargs) -> str:
    with pytest.raises(ValueError, match=match) as info:
        fn(*args, **kwargs)
    return str(info.value)


# ---- world size and tensor parallelism ----------------------------------------------
def test_world_divisible_by_tp_pp_cp():
    msg = fails("tp\\*pp\\*cp", make, gpus=8, tp=1, pp=3)
    assert "world size 8" in msg and "cluster.num_nodes" in msg
    spec = make(gpus=8, tp=2, pp=2, cp=2)
    assert spec.dp == 1


def test_heads_divisible_by_tp():
    model = dataclasses.replace(DENSE, num_attention_heads=12, num_query_groups=None,
                                hidden_size=384)
    fails("model.num_attention_heads=12 .*parallel.tp=8", make, model, tp=8,
          sequence_parallel=True)
    assert make(model, tp=4, sequence_parallel=True).parallel.tp == 4


def test_query_groups_divisible_by_tp():
    model = dataclasses.replace(DENSE, num_query_groups=2)
    fails("model.num_query_groups=2 .*parallel.tp=4", make, model, tp=4)
    assert make(model, tp=2).dp == 4


def test_mla_has_no_query_group_rule():
    spec = make(DSV3, gpus=256, tp=8, pp=4, ep=8, etp=1, sequence_parallel=True)
    assert spec.model.multi_latent_attention and spec.parallel.tp == 8


# ---- pipeline layouts ---------------------------------------------------------------
def test_layers_fewer_than_virtual_stages():
    fails("num_layers=4 is smaller than pp\\*vpp=8", make, dataclasses.replace(
        DENSE, num_layers=4), pp=4, vpp=2)
    spec = make(dataclasses.replace(DENSE, num_layers=8), pp=4, vpp=2)
    assert spec.layout.how == "even" and spec.layout.layers_per_virtual_stage == (1,) * 8


def test_uneven_layers_get_the_balanced_layout():
    spec = make(dataclasses.replace(DENSE, num_layers=5), pp=4)
    assert spec.layout.how == "balanced"
    assert spec.layout.layers_per_virtual_stage == (1, 2, 1, 1)
    assert "balanced" in spec.layout.describe()


def test_account_for_embedding_and_loss():
    model = dataclasses.replace(DENSE, num_layers=8)
    msg = fails("account_for_embedding/loss_in_pipeline_split", make, model, pp=4,
                account_for_embedding_in_pipeline_split=True,
                account_for_loss_in_pipeline_split=True)
    assert "num_layers=8" in msg and "pp\\*vpp" not in msg
    spec = make(dataclasses.replace(DENSE, num_layers=6), pp=4,
                account_for_embedding_in_pipeline_split=True,
                account_for_loss_in_pipeline_split=True)
    assert spec.layout.layers_per_virtual_stage == (1, 2, 2, 1)
    assert spec.layout.how == "embedding/loss"


def test_decoder_first_last_pipeline_num_layers():
    model = dataclasses.replace(DENSE, num_layers=10)
    fails("decoder_first/last_pipeline_num_layers", make, model, pp=4,
          decoder_first_pipeline_num_layers=2)
    fails("decoder_first_pipeline_num_layers=6 and decoder_last_pipeline_num_layers=6",
          make, model, pp=4, decoder_first_pipeline_num_layers=6,
          decoder_last_pipeline_num_layers=6)
    fails("decoder_first_pipeline_num_layers=1 requires pp > 1", ParallelSpec,
          decoder_first_pipeline_num_layers=1)
    spec = make(model, pp=4, decoder_first_pipeline_num_layers=1)
    assert spec.layout.layers_per_virtual_stage == (1, 3, 3, 3)
    assert spec.layout.how == "first/last"


def test_explicit_pipeline_layout():
    fails("pipeline_layout has 3 entries; it must have pp\\*vpp=4", ParallelSpec, pp=4,
          pipeline_layout=(2, 2, 4))
    fails("pipeline_layout sums to 9 layers; model.num_layers=8", make, pp=4,
          pipeline_layout=(2, 2, 2, 3))
    spec = make(pp=4, pipeline_layout=(1, 3, 3, 1))
    assert spec.layout.how == "explicit" and spec.layout.stage_num_layers(1) == 3


def test_llama31_405b_pp8_vpp8_with_embedding_and_loss():
    spec = make(LLAMA405, gpus=64, tp=8, pp=8, vpp=8, sequence_parallel=True, seq=8192,
                account_for_embedding_in_pipeline_split=True,
                account_for_loss_in_pipeline_split=True)
    counts = spec.layout.layers_per_virtual_stage
    assert spec.layout.how == "embedding/loss"
    assert counts == (1,) + (2,) * 62 + (1,) and sum(counts) == 126
    # Nothing given: the balanced layout is chosen, and it is the same one.
    plain = make(LLAMA405, gpus=64, tp=8, pp=8, vpp=8, sequence_parallel=True, seq=8192)
    assert plain.layout.how == "balanced"
    assert plain.layout.layers_per_virtual_stage == counts
    assert "balanced layout" in plain.layout.describe()


def test_deepseek_v3_pp16():
    spec = make(DSV3, gpus=256, pp=16, ep=8)
    counts = spec.layout.layers_per_virtual_stage
    assert spec.layout.how == "balanced" and len(counts) == 16 and sum(counts) == 61
    assert max(counts) - min(counts) == 1 and counts[0] == 3 and counts[-1] == 3
    uneven = make(DSV3, gpus=256, pp=16, ep=8, decoder_first_pipeline_num_layers=1,
                  decoder_last_pipeline_num_layers=4)
    assert uneven.layout.layers_per_virtual_stage == (1,) + (4,) * 15


# ---- experts ------------------------------------------------------------------------
def test_experts_divisible_by_ep():
    fails("model.num_moe_experts=4 is not divisible by parallel.ep=3", make, MOE,
          gpus=6, ep=3)
    assert make(MOE, gpus=8, ep=4).expert_dp == 2


def test_ep_times_etp_divides_world_over_pp():
    msg = fails("parallel.ep\\*etp=4\\*2=8 does not divide", make, MOE, gpus=8, pp=2,
                ep=4, etp=2)
    assert "world/pp=8/2=4" in msg
    spec = make(MOE, gpus=8, pp=2, ep=2, etp=2)
    assert spec.expert_dp == 1


def test_ep_needs_an_moe_model():
    fails("parallel.ep=2 > 1 needs an MoE model", make, DENSE, ep=2)


def test_moe_with_tp_requires_sequence_parallel():
    fails("parallel.tp=2 > 1 requires parallel.sequence_parallel=True", make, MOE, tp=2)
    assert make(MOE, tp=2, sequence_parallel=True).parallel.sequence_parallel


# ---- batch and sequence -------------------------------------------------------------
def test_global_batch_divisible_by_mbs_dp():
    fails("train.global_batch_size=24 is not divisible by micro_batch_size\\*dp=2\\*8",
          make, mbs=2, gbs=24)
    assert make(mbs=2, gbs=32).num_microbatches == 2


def test_seq_length_divisible_by_2cp():
    fails("train.seq_length=4100 is not divisible by 2\\*cp=2\\*4", make, cp=4, seq=4100)
    assert make(cp=4, seq=4096).parallel.cp == 4


def test_sequence_parallel_needs_seq_divisible_by_tp():
    fails("seq_length/cp=4098 is not divisible by tp=4", make, tp=4,
          sequence_parallel=True, seq=4098)


def test_interleaved_needs_enough_microbatches():
    fails("num_microbatches >= pp", make, pp=4, vpp=2, gbs=2)
    assert make(pp=4, vpp=2, gbs=8).parallel.resolved_schedule == "interleaved"


# ---- parallel switches --------------------------------------------------------------
def test_sequence_parallel_requires_tp():
    fails("parallel.sequence_parallel=True requires tp > 1", ParallelSpec,
          sequence_parallel=True)
    assert ParallelSpec(tp=2, sequence_parallel=True).sequence_parallel


def test_vpp_requires_pp():
    fails("parallel.vpp=2 requires pp > 1", ParallelSpec, vpp=2)
    assert ParallelSpec(pp=2, vpp=2).resolved_schedule == "interleaved"


def test_schedule_and_order_names():
    fails("parallel.schedule='interleaved' requires vpp > 1", ParallelSpec, pp=2,
          schedule="interleaved")
    fails("parallel.schedule='1f1b' requires vpp=1", ParallelSpec, pp=2, vpp=2,
          schedule="1f1b")
    fails("parallel.schedule='gpipe' must be one of", ParallelSpec, schedule="gpipe")
    fails("parallel.order='tp-dp-pp' must be a permutation", ParallelSpec,
          order="tp-dp-pp")
    fails("parallel.tp=0 must be a positive integer", ParallelSpec, tp=0)
    assert ParallelSpec(order="tp-cp-ep-pp-dp").order == "tp-cp-ep-pp-dp"


def test_fsdp_turns_the_distributed_optimizer_off():
    assert not ParallelSpec(fsdp=True).use_distributed_optimizer


# ---- training -----------------------------------------------------------------------
def test_precision_names():
    fails("train.precision='fp4' must be one of", TrainSpec, precision="fp4")
    fails("train.fp8_recipe='weird' must be one of", TrainSpec, precision="fp8",
          fp8_recipe="weird")
    assert TrainSpec(precision="fp16").param_bytes == 2


def test_recompute_names():
    fails("train.recompute_granularity='partial' must be one of", TrainSpec,
          recompute_granularity="partial")
    fails("train.recompute_method=None: recompute_granularity='full' needs", TrainSpec,
          recompute_granularity="full", recompute_num_layers=1)
    fails("train.recompute_num_layers=None", TrainSpec, recompute_granularity="full",
          recompute_method="uniform")
    fails("train.recompute_method='uniform' requires recompute_granularity='full'",
          TrainSpec, recompute_granularity="selective", recompute_method="uniform")
    fails("train.recompute_method='sometimes' must be one of", TrainSpec,
          recompute_granularity="full", recompute_method="sometimes",
          recompute_num_layers=1)
    ok = TrainSpec(recompute_granularity="full", recompute_method="block",
                   recompute_num_layers=2)
    assert ok.recompute_num_layers == 2


def test_recompute_layers_fit_a_chunk():
    train = TrainSpec(recompute_granularity="full", recompute_method="uniform",
                      recompute_num_layers=3, global_batch_size=64)
    fails("train.recompute_num_layers=3 exceeds the 2 layers", make, pp=4, train=train)
    assert make(pp=2, train=train).layout.stage_num_layers(0) == 4


def test_batch_fields_positive():
    fails("train.micro_batch_size=0 must be a positive integer", TrainSpec,
          micro_batch_size=0)


def test_device_hw_queues_is_a_positive_int_or_none():
    fails("train.device_hw_queues=0 must be an int >= 1", TrainSpec, device_hw_queues=0)
    fails("train.device_hw_queues=True must be an integer", TrainSpec,
          device_hw_queues=True)
    assert TrainSpec(device_hw_queues=2).device_hw_queues == 2


# ---- model --------------------------------------------------------------------------
def test_model_rules():
    fails("num_attention_heads=8 is not divisible by num_query_groups=3", ModelSpec,
          name="m", num_layers=2, hidden_size=64, num_attention_heads=8,
          num_query_groups=3)
    fails("hidden_size=100 is not divisible by num_attention_heads=8", ModelSpec,
          name="m", num_layers=2, hidden_size=100, num_attention_heads=8)
    assert ModelSpec(name="m", num_layers=2, hidden_size=100, num_attention_heads=8,
                     kv_channels=16).head_dim == 16
    fails("model.moe_router_topk=5 exceeds num_moe_experts=4", dataclasses.replace,
          MOE, moe_router_topk=5)
    fails("model.moe_first_k_dense=4 must be below num_layers=4", dataclasses.replace,
          MOE, moe_first_k_dense=4)
    fails("model.normalization='BatchNorm' must be one of", dataclasses.replace, DENSE,
          normalization="BatchNorm")
    fails("model.activation='tanh' must be one of", dataclasses.replace, DENSE,
          activation="tanh")
    fails("model.hidden_dropout=1.0 must be below 1", dataclasses.replace, DENSE,
          hidden_dropout=1.0)
    fails("model.num_layers=0 must be a positive integer", dataclasses.replace, DENSE,
          num_layers=0)


def test_cluster_rules():
    fails("cluster.num_nodes=0 must be a positive integer", ClusterSpec, hardware=H100,
          num_nodes=0)
    assert ClusterSpec(hardware=H100, num_nodes=2, gpus_per_node=4).world_size == 8


# ---- properties ---------------------------------------------------------------------
@st.composite
def run_specs(draw):
    """Random (often illegal) runs; the tests keep the ones that construct."""
    tp = draw(st.sampled_from([1, 2, 4, 8]))
    pp = draw(st.integers(1, 8))
    vpp = draw(st.integers(1, 4)) if pp > 1 else 1
    cp = draw(st.sampled_from([1, 2, 4]))
    heads = draw(st.sampled_from([8, 16, 32]))
    groups = draw(st.sampled_from([g for g in (1, 2, 4, 8, 16, 32) if heads % g == 0]))
    layout_kind = draw(st.sampled_from(["auto", "emb_loss", "first_last", "explicit"]))
    par: dict = {}
    if layout_kind == "explicit":
        counts = draw(st.lists(st.integers(0, 6), min_size=pp * vpp, max_size=pp * vpp))
        assume(sum(counts) > 0)
        par["pipeline_layout"] = tuple(counts)
        layers = sum(counts)
    else:
        layers = draw(st.integers(1, 64))
        if layout_kind == "emb_loss":
            par["account_for_embedding_in_pipeline_split"] = draw(st.booleans())
            par["account_for_loss_in_pipeline_split"] = draw(st.booleans())
        elif layout_kind == "first_last" and pp > 1:
            par["decoder_first_pipeline_num_layers"] = draw(
                st.none() | st.integers(0, layers))
            par["decoder_last_pipeline_num_layers"] = draw(
                st.none() | st.integers(0, layers))
    moe = draw(st.booleans())
    model = ModelSpec(name="p", num_layers=layers, hidden_size=64 * heads,
                      num_attention_heads=heads, num_query_groups=groups,
                      vocab_size=1000, num_moe_experts=8 if moe else None,
                      moe_ffn_hidden_size=128 if moe else None)
    if moe:
        par["ep"] = draw(st.sampled_from([1, 2, 4, 8]))
        par["etp"] = draw(st.sampled_from([None, 1, 2]))
    # Mostly worlds that tp*pp*cp divides (the rest exercise the world-size rule).
    mp = tp * pp * cp
    world = mp * draw(st.integers(1, 8)) + draw(st.sampled_from([0, 0, 0, 1]))
    per_node = draw(st.sampled_from([n for n in (1, 2, 4, 8) if world % n == 0]))
    nodes = world // per_node
    dp = world // mp
    mbs = draw(st.integers(1, 4))
    gbs = mbs * dp * draw(st.integers(1, 32))
    seq = draw(st.sampled_from([1024, 2048, 4096, 4104]))
    return dict(model=model, tp=tp, pp=pp, vpp=vpp, cp=cp, nodes=nodes, per_node=per_node,
                sp=tp > 1 and draw(st.booleans()), par=par, mbs=mbs, gbs=gbs, seq=seq)


def _build(d) -> RunSpec:
    parallel = ParallelSpec(tp=d["tp"], pp=d["pp"], vpp=d["vpp"], cp=d["cp"],
                            sequence_parallel=d["sp"], **d["par"])
    return RunSpec(model=d["model"], parallel=parallel,
                   train=TrainSpec(seq_length=d["seq"], micro_batch_size=d["mbs"],
                                   global_batch_size=d["gbs"]),
                   cluster=ClusterSpec(hardware=H100, num_nodes=d["nodes"],
                                       gpus_per_node=d["per_node"]))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(run_specs())
def test_any_valid_runspec_is_consistent(d):
    try:
        spec = _build(d)
    except ValueError:
        return  # an illegal layout, rejected with a message (the only allowed failure)
    p = spec.parallel
    assert spec.dp * p.tp * p.pp * p.cp == spec.world_size
    assert spec.num_microbatches * spec.train.micro_batch_size * spec.dp == \
        spec.train.global_batch_size
    counts = spec.layout.layers_per_virtual_stage
    assert len(counts) == p.pp * p.vpp and min(counts) >= 0
    assert sum(counts) == spec.model.num_layers
    assert sum(spec.layout.stage_num_layers(s) for s in range(p.pp)) == spec.model.num_layers
    if spec.layout.how in ("even", "balanced"):
        assert max(counts) - min(counts) <= 1 and min(counts) >= 1
    if spec.model.is_moe:
        assert spec.expert_dp * p.ep * p.expert_tp * p.pp == spec.world_size
        assert spec.model.num_moe_experts % p.ep == 0
    # The layout is a pure function of the spec.
    assert pipeline_layout(spec.model.num_layers, p) == spec.layout


@settings(max_examples=200, deadline=None)
@given(layers=st.integers(1, 200), pp=st.integers(1, 16), vpp=st.integers(1, 8))
def test_balanced_layout_places_every_layer(layers, pp, vpp):
    assume(pp > 1 or vpp == 1)
    par = ParallelSpec(pp=pp, vpp=vpp)
    if layers < pp * vpp:
        with pytest.raises(ValueError, match="smaller than pp\\*vpp"):
            pipeline_layout(layers, par)
        return
    layout = pipeline_layout(layers, par)
    counts = layout.layers_per_virtual_stage
    assert sum(counts) == layers and max(counts) - min(counts) <= 1
    nv, extra = pp * vpp, layers % (pp * vpp)
    if extra:
        assert layout.how == "balanced"
        if extra <= nv - 2:
            # Extra layers go to middle stages first (the ends carry embedding / loss).
            assert counts[0] == counts[-1] == min(counts)
