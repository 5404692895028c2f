"""What a Megatron row leaves unstated takes the current performance recipes' values
(Megatron-Bridge perf_recipes), not Megatron-LM's flag defaults, unless its release
fixes the value; sources with their own documented stack keep theirs. Each filled value
is named in the row's notes."""
from __future__ import annotations

import pytest

from primus_ext.published import read_runs


@pytest.fixture(scope="module")
def by_id():
    return {r.run_id: r for r in read_runs()}


def test_megatron_rows_reduce_gradients_as_their_release_does(by_id):
    # Megatron-LM README (core_r0.8.0): bf16 forces accumulate_allreduce_grads_in_fp32
    # (megatron/training/arguments.py; that release has no --grad-reduce-in-bf16).
    for run_id in ("P046", "P049"):
        run = by_id[run_id]
        assert run.spec.parallel.grad_reduce_in_fp32 is True
        assert any("grad_reduce_in_fp32=True" in n and "core_r0.8.0" in n
                   for n in run.notes), run.notes
    # The NVIDIA tables reduce in BF16 (their performance recipes).
    assert by_id["P032"].spec.parallel.grad_reduce_in_fp32 is False
    # AMD Primus states it: its Megatron base config (trainer_base.yaml) has
    # grad_reduce_in_bf16 false, so Megatron-LM's validate_args reduces in fp32.
    for run_id in ("P093", "P097"):
        run = by_id[run_id]
        assert run.spec.parallel.grad_reduce_in_fp32 is True
        assert any("trainer_base.yaml" in n for n in run.notes), run.notes


def test_megatron_rows_with_tp_overlap_tp_comm_as_the_recipes_do(by_id):
    run = by_id["P049"]  # TP8, Megatron-LM README
    assert run.spec.parallel.tp > 1 and run.spec.parallel.tp_comm_overlap


def test_sources_with_their_own_stack_keep_their_documented_settings(by_id):
    # Llama 3 paper Sec. 3.3.2: FP32 reduce-scatter; torchtitan FSDP2 reduce dtype fp32;
    # llm-foundry FSDP mixed precision DEFAULT (FP32) unless PURE.
    for run_id in ("P090", "P057", "P075"):
        assert by_id[run_id].spec.parallel.grad_reduce_in_fp32 is True, run_id
    assert not by_id["P090"].spec.parallel.tp_comm_overlap  # not a Megatron userbuffers run
    pure = [r for r in by_id.values() if r.source.startswith("llm-foundry")
            and "pure" in r.row["notes"].lower()]
    assert pure and all(r.spec.parallel.grad_reduce_in_fp32 is False for r in pure)


def test_unstated_fp8_recipe_is_current_scaling(by_id):
    run = by_id["P029"]
    assert run.spec.train.fp8_recipe == "tensorwise"
    assert any("fp8_cs" in n for n in run.notes)


def test_fp8_recipe_follows_each_sources_stack(by_id):
    # The software each source ran decides its FP8 recipe: Transformer Engine 1.x
    # (NeMo 24.07) and v0.10 (llm-foundry's FP8 benchmarks) have DelayedScaling only;
    # torchtitan's float8 converter scales tensorwise; NeMo 25.04 rows state current
    # scaling (the fp8_recipe column).
    for run_id, recipe, cited in (("P010", "delayed", "Transformer Engine 1.x"),
                                  ("P087", "delayed", "Transformer Engine v0.10"),
                                  ("P063", "tensorwise", "torchao Float8Linear"),
                                  ("P022", "tensorwise", "column fp8_recipe")):
        run = by_id[run_id]
        assert run.spec.train.fp8_recipe == recipe, run_id
        assert any(n.startswith("fp8_recipe=") and cited in n for n in run.notes), \
            (run_id, run.notes)
        assert not any("fp8_cs" in n for n in run.notes), run_id


def test_amd_primus_row_takes_its_example_configs_recompute(by_id):
    # P097 reproduces examples/megatron/configs/MI355X/mixtral_8x22B_v0.1-BF16-pretrain.yaml
    # (TP1 PP4 EP8, mbs 2): recompute_method block with 0 layers, i.e. none.
    run = by_id["P097"]
    assert run.spec.train.recompute_granularity is None
    assert any("mixtral_8x22B_v0.1-BF16-pretrain.yaml" in n for n in run.notes)
    # The MI325X 70B rows state other micro batches than the Primus file: not applied.
    assert not any("llama3.1_70B-BF16-pretrain.yaml" in n for n in by_id["P096"].notes)


def test_rows_with_pp_overlap_on_run_interleaved(by_id):
    # "DP/TP/PP comm overlap on" with PP > 1 and no vp: megatron-core overlaps pipeline
    # p2p only with virtual stages (core_r0.8.0 arguments.py), so the row interleaved.
    for run_id, vpp in (("P050", 2), ("P053", 2), ("P054", 7)):
        run = by_id[run_id]
        assert run.spec.parallel.vpp == vpp, run_id
        assert any(n.startswith("vpp=") and "overlap_p2p_comm" in n for n in run.notes)
        assert not any("no interleaving assumed" in n for n in run.notes)
    assert by_id["P046"].spec.parallel.vpp == 1  # PP 1: nothing to interleave


def test_bridge_2509_rows_take_their_perf_matrix_memory_setting(by_id):
    # Megatron-Bridge v0.1.0rc4 scripts/performance perf_matrix: GB200 Megatron-FSDP
    # Llama 3 70B (mbs 2) offloads 40 layers' activations, 405B (TP2) 95; no recompute.
    for run_id, layers in (("P041", 40), ("P042", 95)):
        spec = by_id[run_id].spec
        assert spec.parallel.fsdp and spec.train.recompute_granularity is None
        assert spec.train.cpu_offloading_num_layers == layers
        assert spec.train.cross_entropy_fusion_impl == "te"
        assert any("perf_matrix.gb200" in n for n in by_id[run_id].notes)
    # Same source, other layouts (no FSDP, or a layout the matrix does not list): TE's
    # cross entropy, no offloading.
    for run_id in ("P030", "P040"):
        spec = by_id[run_id].spec
        assert spec.train.cpu_offloading_num_layers == 0
        assert spec.train.cross_entropy_fusion_impl == "te"
    # NeMo 2.0 tables: the native fused kernel (not stated otherwise).
    assert by_id["P023"].spec.train.cross_entropy_fusion_impl == "native"


def test_perf_matrix_needs_the_same_recipe():
    from primus_ext.published.perf_matrix import perf_matrix_memory
    from primus_ext.published.recipes import Recipe, RowFacts

    def facts(**kw):
        base = dict(source="MegatronBridge-perf-25.09", model_preset="llama3_70b",
                    gpu="GB200", notes="", num_layers=80, is_moe=False, tp=1, pp=1,
                    cp=1, dp=64, vpp=1, vp_stated=False, mbs_stated=True, mbs=2, ep=1,
                    gbs=128, seq=8192, recompute_stated=False, precision="fp8",
                    sharding="fsdp")
        return RowFacts(**(base | kw))

    for kw, layers in (({}, 40), ({"mbs": 1}, 0), ({"sharding": ""}, 0),
                       ({"recompute_stated": True}, 0), ({"precision": "bf16",
                                                          "mbs": 1}, 20)):
        rec = Recipe()
        perf_matrix_memory(facts(**kw), rec)
        assert rec.train.get("cpu_offloading_num_layers", 0) == layers, kw


def test_llm_foundry_attention_follows_the_table_that_ran_it(by_id):
    # The ">= 128 GPUs" table: sweep.py (5e85bd62d), attn_impl flash, pip .[gpu-flash2]
    # (flash-attn 2.4.2), except 13b.yaml and 30b.yaml, which it runs with --attn_impl
    # triton. The other tables: sweep.sh (b2a43a147) leaves --attn_impl at
    # submit_benchmarks.py's default 'triton' (flash_attn_triton.py, FlashAttention-1 class).
    for run_id, impl, cite in (("P079", "fa2", "5e85bd62d"), ("P081", "fa2", "gpu-flash2"),
                               ("P075", "fa2", "5e85bd62d"), ("P077", "fa1", "30b.yaml"),
                               ("P078", "fa1", "13b.yaml"),
                               ("P083", "fa1", "b2a43a147"), ("P087", "fa1", "triton"),
                               ("P089", "fa1", "triton")):
        run = by_id[run_id]
        assert run.spec.train.flash_attn_impl == impl, run_id
        assert any("flash_attn_impl" in n and cite in n for n in run.notes), run.notes
    # Its checkpointing is torch's non-reentrant checkpoint_wrapper: early stop.
    for run_id in ("P075", "P084"):
        assert by_id[run_id].spec.train.recompute_early_stop is True
    assert by_id["P046"].spec.train.recompute_early_stop is False  # Megatron-LM
