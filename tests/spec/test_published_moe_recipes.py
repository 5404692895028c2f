"""The MoE settings each source's recipe documents reach the row's spec, with a note
(published/bridge_moe.py for Megatron-Bridge's releases, published/moe_sources.py for the
Megatron-MoE-ModelZoo, NeMo AutoModel and AMD Primus' MoE package)."""
from __future__ import annotations

import dataclasses

import pytest

from primus_ext.published import DEFAULT_PATH, read_runs
from primus_ext.published.bridge_moe import ENTRIES, precision_kind


@pytest.fixture(scope="module")
def by_id():
    return {r.run_id: r for r in read_runs(DEFAULT_PATH)}


def _noted(run, text):
    return any(text in n for n in run.notes)


def test_bridge_2509_qwen3_runs_drop_tokens_padded_to_capacity(by_id):
    # v0.1.0rc4 scripts/performance/run_script.py: qwen3 -> apply_moe_token_drop(cf 1.0,
    # padded), the all-to-all dispatcher; not forced.
    for run_id in ("P033", "P034", "P038", "P039", "P044", "P045"):
        s = by_id[run_id].spec
        assert s.model.moe_expert_capacity_factor == 1.0, run_id
        assert s.model.moe_pad_expert_input_to_capacity, run_id
        assert s.parallel.moe_token_dispatcher_type == "alltoall"
        assert not s.train.moe_router_force_load_balancing
        assert _noted(by_id[run_id], "apply_moe_token_drop")


def test_bridge_26x_rows_take_their_release_config(by_id):
    # 26.08 GB200 MXFP8 (perf_recipes/qwen/gb200/qwen3_moe.py, common.py
    # _enable_hybridep_full_iteration_mxfp8): HybridEP, full-iteration graph, EP A2A
    # overlap, fused grouped MLP, FP8 attention.
    s = by_id["P119"].spec
    assert (s.parallel.moe_token_dispatcher_type, s.parallel.moe_flex_dispatcher_backend) \
        == ("flex", "hybridep")
    assert s.train.cuda_graph_scope == ("full_iteration",)
    assert s.parallel.overlap_moe_expert_parallel_comm and s.parallel.moe_fused_grouped_mlp
    assert s.train.fp8_dot_product_attention and s.train.fp8_recipe == "mxfp8"
    assert s.train.moe_router_force_load_balancing and s.parallel.moe_router_fusion
    # 26.02.01 Qwen3-235B H100 FP8: qwen3_llm_pretrain.py sets the all-to-all dispatcher,
    # the workload config the A2A overlap; FP8 here is current scaling, not MXFP8.
    s = by_id["P128"].spec
    assert s.parallel.moe_token_dispatcher_type == "alltoall"
    assert s.parallel.overlap_moe_expert_parallel_comm
    assert s.train.fp8_recipe == "tensorwise"
    # 26.02.01 GPT-OSS: selective recompute of layernorm and moe_act.
    s = by_id["P123"].spec
    assert s.train.recompute_granularity == "selective"
    assert set(s.train.recompute_modules) == {"layernorm", "moe_act"}
    # Megatron-Bridge's GPT-OSS is YaRN RoPE, which its provider runs unfused, and its
    # gated unit is megatron-core's quick-GeGLU clamped at 7.0 (gpt_oss_bridge.py).
    assert not s.train.apply_rope_fusion and _noted(by_id["P123"], "gpt_oss_bridge.py")
    assert s.model.activation == "quick_geglu" and s.model.activation_func_clamp_value == 7.0


def test_mxfp8_is_read_from_the_precision_statement_only():
    assert precision_kind("fp8", "precision MXFP8 (1x32-block FP8, E8M0 scales)") == "fp8_mx"
    assert precision_kind("fp8", "MXFP8 (--fp8-recipe mxfp8, with fp8 param gather)") \
        == "fp8_mx"
    # a 26.x FP8 row whose notes name MXFP8 only to say it is not that recipe
    assert precision_kind("fp8", "precision 'FP8' (the scaling recipe is not named; the "
                          "table lists FP8 apart from MXFP8 and NVFP4)") == "fp8_cs"
    assert precision_kind("bf16", "precision MXFP8") == "bf16"


def test_every_bridge_entry_names_its_file():
    for key, entry in ENTRIES.items():
        assert entry.path and ("scripts/performance" in entry.path
                               or "perf_recipes" in entry.path), key


def test_modelzoo_rows(by_id):
    # sbatch_benchmarking.sh: DISPATCHER default deepep; the A2A row alltoall; A2A_OVERLAP.
    assert by_id["P102"].spec.parallel.moe_token_dispatcher_type == "flex"
    assert by_id["P102"].spec.parallel.moe_flex_dispatcher_backend == "deepep"
    assert by_id["P101"].spec.parallel.moe_token_dispatcher_type == "alltoall"
    assert by_id["P107"].spec.parallel.moe_flex_dispatcher_backend == "hybridep"
    assert by_id["P099"].spec.parallel.overlap_moe_expert_parallel_comm
    assert not by_id["P098"].spec.parallel.overlap_moe_expert_parallel_comm
    # forced by the row (long context; the H100 table's own launch script) or by the
    # repository's script for the row's layout
    s = by_id["P101"].spec
    assert s.train.moe_routing_data == "real" and s.train.moe_router_force_load_balancing
    assert by_id["P103"].spec.train.moe_router_force_load_balancing
    assert by_id["P098"].spec.train.moe_router_force_load_balancing
    assert _noted(by_id["P098"], "run_h100_235b.sh")
    # the FSDP row's line: --no-gradient-accumulation-fusion
    assert not by_id["P100"].spec.train.gradient_accumulation_fusion
    assert by_id["P101"].spec.train.gradient_accumulation_fusion
    # the benchmarking yaml: fused router and permutation, aux loss, fp32 router, FP32
    # gradient reduction (no --grad-reduce-in-bf16)
    assert s.parallel.moe_router_fusion and s.parallel.moe_permute_fusion
    assert "aux_loss" in s.parallel.moe_router_terms
    assert s.parallel.grad_reduce_in_fp32
    assert by_id["P107"].spec.train.cuda_graph_scope == ("attn", "moe_router",
                                                         "moe_preprocess")
    assert by_id["P108"].spec.train.fp8_recipe == "mxfp8"
    assert "padding" in by_id["P108"].spec.parallel.moe_router_terms


def test_modelzoo_row_that_states_no_balancing_routes_the_text(tmp_path):
    # P101 with the forcing sentence taken out of its notes: the router routes the text.
    lines = DEFAULT_PATH.read_text().splitlines(keepends=True)
    row = next(x for x in lines if x.startswith("P101,"))
    cut = row.split("forced load balancing")[0] + "router balancing not stated\",,,,\n"
    path = tmp_path / "runs.csv"
    path.write_text(lines[0] + cut)
    (run,) = read_runs(path)
    assert run.spec.train.moe_routing_data == "real"
    assert not run.spec.train.moe_router_force_load_balancing


def test_automodel_rows(by_id):
    for run_id in ("P109", "P110", "P111", "P112"):
        s = by_id[run_id].spec
        assert s.parallel.moe_token_dispatcher_type == "flex", run_id
        assert s.train.moe_router_exact_balance, run_id  # FakeBalancedGate
        assert s.train.moe_routing_data == "mock", run_id
    for run_id in ("P109", "P110"):  # AutoModel's DeepSeek-V3 has no MTP module
        assert by_id[run_id].spec.model.mtp_num_layers == 0
    # FSDP2 without a pipeline: reshard_after_forward=False (moe/parallelizer.py) and the
    # gradient sync deferred to the last microbatch (moe/fsdp_mixin.py): one gather and
    # one reduce-scatter per step, as under a pipeline (P109, P110)
    for run_id in ("P109", "P110", "P111", "P112"):
        p = by_id[run_id].spec.parallel
        assert not p.fsdp and p.use_distributed_optimizer, run_id
        assert p.grad_buffer == "on_backward", run_id
    assert _noted(by_id["P111"], "prepare_for_grad_accumulation")
    # AutoModel's clamped GPT-OSS activation is one torch.compile'd kernel: no clamp pass.
    assert by_id["P112"].spec.model.activation_func_clamp_value is None
    assert by_id["P112"].spec.train.apply_rope_fusion


def test_primus_moe_package_rows(by_id):
    base, tuned = by_id["P115"].spec, by_id["P116"].spec
    assert base.train.moe_router_force_load_balancing
    assert not base.parallel.moe_permute_fusion  # baseline yaml
    assert base.parallel.moe_token_dispatcher_type == "alltoall"
    # MoE_Features 3 4 5: TE loss fusion, Primus-Turbo DeepEP, sync-free stage 1
    assert tuned.parallel.moe_token_dispatcher_type == "flex"
    assert tuned.parallel.moe_permute_fusion and tuned.parallel.moe_router_fusion
    assert tuned.train.cross_entropy_fusion_impl == "te"
    # baseline yaml: gradient_accumulation_fusion false
    for run_id in ("P113", "P114", "P115", "P116"):
        assert not by_id[run_id].spec.train.gradient_accumulation_fusion, run_id
        assert _noted(by_id[run_id], "gradient_accumulation_fusion false"), run_id
    assert by_id["P097"].spec.train.gradient_accumulation_fusion  # not stated there
    # run_deepseek_v2*_pretrain_mi355x.sh: export GPU_MAX_HW_QUEUES=${...:-2}
    for run_id in ("P113", "P114", "P115", "P116"):
        assert by_id[run_id].spec.train.device_hw_queues == 2, run_id
        assert _noted(by_id[run_id], "GPU_MAX_HW_QUEUES"), run_id
    assert by_id["P097"].spec.train.device_hw_queues is None  # not stated there
    # Figure 6's baseline micro-batch sweep: the MBS 12 bar's settings, GBS 64 x MBS.
    for run_id, mbs in (("P131", 1), ("P132", 2), ("P133", 4), ("P134", 8)):
        sweep, bar = by_id[run_id].spec, by_id["P113"].spec
        assert sweep.train.micro_batch_size == mbs, run_id
        assert sweep.train.global_batch_size == 64 * mbs, run_id
        assert dataclasses.replace(sweep.train, micro_batch_size=12,
                                   global_batch_size=768) == bar.train, run_id
        assert (sweep.parallel, sweep.model) == (bar.parallel, bar.model), run_id


def test_nvidia_and_primus_rows_route_mock_data(by_id):
    for run_id in ("P019", "P033", "P097", "P119"):
        assert by_id[run_id].spec.train.moe_routing_data == "mock", run_id
