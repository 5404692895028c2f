"""The published-run reader: every row of the public set becomes a RunSpec or one clear
per-row error; names, GPUs, layouts and batch gaps are filled by the documented rules."""
from __future__ import annotations

import csv
import io
from dataclasses import replace
from pathlib import Path

import pytest

from primus_ext.memory.params import count_params
from primus_ext.published.gaps import MBS_CANDIDATES
from primus_ext.published import (DEFAULT_MICROBATCHES_PER_STAGE, DEFAULT_PATH,
                                  PublishedRun, hardware_preset_name, match_model_preset,
                                  normalize_model_name, parse_row, read_runs)
from primus_ext.spec import RunSpec

MAX_ERRORS = 3
EXPECTED_ERRORS: set[str] = set()  # every row of the public set becomes a RunSpec
TUNED = {"P055", "P056"}  # strong-scaling endpoints: no published layout (tuner's layout)


@pytest.fixture(scope="module")
def runs() -> list[PublishedRun]:
    return read_runs(DEFAULT_PATH)


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    with open(DEFAULT_PATH, newline="") as f:
        return list(csv.DictReader(f))


def _by_id(runs):
    return {r.run_id: r for r in runs}


def test_every_row_loads_or_errors(runs, rows):
    assert [r.run_id for r in runs] == [row["run_id"] for row in rows]
    for run in runs:
        assert (run.spec is None) != (run.error is None), run.run_id
        if run.spec is not None:
            assert isinstance(run.spec, RunSpec)
    errors = {r.run_id: r.error for r in runs if r.error}
    assert len(errors) <= MAX_ERRORS, errors
    assert set(errors) == EXPECTED_ERRORS, errors
    for run_id in TUNED:
        assert any("the tuner's best layout" in n for n in _by_id(runs)[run_id].notes)


def test_derived_dp_equals_the_dp_column(runs):
    for run in runs:
        if run.spec is not None and run.row["dp"]:
            assert run.spec.dp == int(run.row["dp"]), run.run_id
            p = run.spec.parallel
            assert run.spec.dp * p.tp * p.pp * p.cp == int(run.row["num_gpus"])


def test_columns_reach_the_spec(runs):
    for run in runs:
        if run.spec is None:
            continue
        row, s = run.row, run.spec
        assert s.train.seq_length == int(row["seq_len"])
        assert s.world_size == int(row["num_gpus"])
        assert s.model.num_layers == int(row["layers"])
        assert s.model.hidden_size == int(row["hidden"])
        assert s.model.num_attention_heads == int(row["heads"])
        if row["kv_heads"]:
            assert s.model.num_groups == int(row["kv_heads"])
        if row["ffn_hidden"]:
            assert s.model.dense_ffn_size == int(row["ffn_hidden"])
        if row["num_experts"]:
            assert s.model.num_moe_experts == int(row["num_experts"])
            assert s.model.moe_router_topk == int(row["topk"])
            assert s.model.expert_ffn_size == int(row["moe_ffn_hidden"])
        if run.run_id not in TUNED:
            assert s.parallel.tp == int(row["tp"]) and s.parallel.pp == int(row["pp"])
        if row["vp"]:
            assert s.parallel.vpp == int(row["vp"])
        elif s.parallel.vpp != 1 and run.run_id not in TUNED:  # a recipe rule chose it
            assert any(n.startswith("vpp=") for n in run.notes)
        assert s.parallel.sequence_parallel == (s.parallel.tp > 1)
        assert run.is_moe == s.model.is_moe == (row["arch"] == "moe")
        if row["mbs"]:
            assert s.train.micro_batch_size == int(row["mbs"])
        if row["gbs"]:
            assert s.train.global_batch_size == int(row["gbs"])
        assert run.precision == row["precision"]
        assert run.model_preset is not None or row["model"].startswith("MegatronGPT")
        assert run.hardware_preset == hardware_preset_name(row["gpu"])


def test_parameter_counts_near_the_published_size(runs):
    # Published sizes are mostly nominal ("8B" for Nemotron-3 8B's 8.5B); 10 % catches a
    # wrong architecture, test_presets checks the exact counts.
    for run in runs:
        if run.spec is not None:
            ours = count_params(run.spec.model).num_params / 1e9
            assert ours == pytest.approx(float(run.row["params_total_b"]), rel=0.10), run.run_id


def test_moe_rows_get_preset_details(runs):
    by_id = _by_id(runs)
    ds = by_id["P032"].spec.model
    assert ds.multi_latent_attention and ds.q_lora_rank == 1536 and ds.kv_lora_rank == 512
    assert ds.moe_first_k_dense == 3 and ds.moe_shared_expert_intermediate_size == 2048
    assert ds.mtp_num_layers == 1 and ds.dense_ffn_size == 18432
    assert by_id["P033"].spec.model.head_dim == 128  # Qwen3: q wider than hidden
    assert by_id["P020"].spec.model.vocab_size == 32768  # empty vocab -> preset
    assert any("vocab empty" in n for n in by_id["P020"].notes)
    for run in runs:
        if run.spec is not None and run.is_moe and not run.row["etp"]:
            assert run.spec.parallel.etp == 1
            assert any("etp empty" in n for n in run.notes)


def test_uneven_layouts_are_balanced_and_reported(runs):
    by_id = _by_id(runs)
    for run_id in ("P016", "P034"):
        spec = by_id[run_id].spec
        assert spec.layout.how == "balanced"
        assert sum(spec.layout.layers_per_virtual_stage) == spec.model.num_layers
        assert any("balanced layout" in n for n in by_id[run_id].notes)
    # DeepSeek-V3 rows take the layout their Megatron-Bridge recipe documents.
    for run_id in ("P037", "P032"):
        spec = by_id[run_id].spec
        assert spec.layout.how == "explicit"
        assert sum(spec.layout.layers_per_virtual_stage) == spec.model.num_layers
        assert any("pipeline layout for" in n for n in by_id[run_id].notes)
    # Llama 3.1 405B PP8 VPP8: the balanced layout is Megatron's embedding/loss layout.
    assert by_id["P016"].spec.layout.layers_per_virtual_stage == (1,) + (2,) * 62 + (1,)


def test_gap_rules_are_recorded(runs, rows):
    by_id = _by_id(runs)
    gpt = by_id["P046"]
    assert gpt.model_preset is None
    m = gpt.spec.model
    assert m.activation == "gelu" and m.normalization == "LayerNorm"
    assert m.dense_ffn_size == 4 * m.hidden_size and m.num_groups == m.num_attention_heads
    assert any("mbs empty" in n for n in gpt.notes)
    # GBS from a default named in the notes (P097 with its GBS cell emptied and the
    # Primus example config's default named), else the documented default.
    p097 = next(row for row in rows if row["run_id"] == "P097")
    named = parse_row({**p097, "gbs": "", "notes": "GBS not given (example config default 128)"})
    assert named.spec.train.global_batch_size == 128
    assert any("default named in the row's notes" in n for n in named.notes)
    assert by_id["P097"].spec.train.global_batch_size == 256  # the page's own projection
    p093 = by_id["P093"].spec
    assert p093.num_microbatches == DEFAULT_MICROBATCHES_PER_STAGE * p093.parallel.pp
    assert any("gbs empty" in n for n in by_id["P093"].notes)
    # Sharding and recompute columns (torchtitan rows read as framework=torchtitan).
    assert by_id["P075"].spec.parallel.fsdp
    full = by_id["P075"].spec.train
    assert (full.recompute_granularity, full.recompute_method,
            full.recompute_num_layers) == ("full", "uniform", 1)
    titan = by_id["P057"].spec
    assert titan.framework == "torchtitan" and titan.parallel.dp_shard == 8
    assert titan.train.activation_checkpoint == "selective"
    assert by_id["P060"].spec.train.activation_checkpoint == "full"
    assert by_id["P022"].spec.parallel.use_distributed_optimizer
    assert not by_id["P022"].spec.parallel.fsdp
    # GB200 nodes hold 4 GPUs; 8 GPUs are 2 nodes.
    assert by_id["P022"].spec.cluster.num_nodes == 2


def test_measured_values_are_read(runs):
    by_id = _by_id(runs)
    assert by_id["P001"].measured.tokens_per_s_per_gpu == 23406
    assert by_id["P001"].measured.tflops_per_gpu == 765
    assert by_id["P075"].measured.mfu == pytest.approx(0.4125)
    assert by_id["P001"].measured.step_time_s is None
    # Mapping-style access as well (the validate mode reads it that way).
    assert by_id["P001"].measured.get("tokens_per_s_per_gpu") == 23406
    assert by_id["P001"].measured["tflops_per_gpu"] == 765
    assert by_id["P001"].measured.get("step_time_s") is None
    assert by_id["P001"].measured.get("nonsense") is None


# ---- names --------------------------------------------------------------------------
@pytest.mark.parametrize("name,normalised,preset", [
    ("Llama-3.1-405B", "llama3.1_405b", "llama3.1_405b"),
    ("Grok-1-314B", "grok1_314b", "grok1_314b"),
    ("GPT3-175B", "gpt3_175b", "gpt3_175b"),
    ("Llama-3-70B", "llama3_70b", "llama3_70b"),
    ("Llama-3.1-70B", "llama3.1_70b", "llama3.1_70b"),
    ("LLAMA3-405B", "llama3_405b", "llama3.1_405b"),
    ("Mixtral-8x22B", "mixtral_8x22b", "mixtral_8x22b"),
    ("DeepSeek-V3", "deepseek_v3", "deepseek_v3"),
    ("GPT-OSS-120B", "gpt_oss_120b", "gpt_oss_120b"),
    ("Qwen3-235B-A22B", "qwen3_235b_a22b", "qwen3_235b_a22b"),
    ("Nemotron-4-340B", "nemotron4_340b", "nemotron4_340b"),
    ("nemotron 3 8b", "nemotron3_8b", "nemotron3_8b"),
    ("Meta-Llama-3.1-8B", "meta_llama3.1_8b", "llama3.1_8b"),
    ("MPT-7B", "mpt_7b", "mpt_7b"),
    ("DeepSeekV3", "deepseekv3", "deepseek_v3"),
    ("MegatronGPT-1.7B", "megatrongpt_1.7b", None),
    ("Falcon-180B", "falcon_180b", None),
])
def test_model_name_matching(name, normalised, preset):
    assert normalize_model_name(name) == normalised
    assert match_model_preset(name) == preset


@pytest.mark.parametrize("gpu,preset", [("H100-96GB-500W", "h100_96gb_500w"),
                                        ("H100", "h100"), ("GB200", "gb200"),
                                        ("MI355X", "mi355x")])
def test_gpu_names(gpu, preset):
    assert hardware_preset_name(gpu) == preset


# ---- malformed input ----------------------------------------------------------------
def _row(rows, run_id="P001", **changes) -> dict:
    row = dict(next(r for r in rows if r["run_id"] == run_id))
    row.update(changes)
    return row


def test_non_integer_tp_names_row_and_column(rows):
    run = parse_row(_row(rows, tp="two"))
    assert run.spec is None
    assert "P001" in run.error and "'tp'" in run.error and "'two'" in run.error


def test_missing_column_names_row_and_column(rows):
    row = _row(rows)
    del row["pp"]
    run = parse_row(row)
    assert run.spec is None and "P001" in run.error and "'pp'" in run.error
    assert "missing" in run.error


def test_short_csv_row_is_a_clear_error(tmp_path: Path, rows):
    header = list(rows[0].keys())
    text = ",".join(header) + "\n" + ",".join(_row(rows)[k] for k in header[:20]) + "\n"
    path = tmp_path / "short.csv"
    path.write_text(text)
    (run,) = read_runs(path)
    assert run.spec is None and "P001" in run.error and "missing" in run.error


@pytest.mark.parametrize("changes,column", [
    ({"dp": "32"}, "'dp'"),
    ({"gpu": "TPUv5"}, "'gpu'"),
    ({"num_gpus": "12"}, "'num_gpus'"),
    # A model with no preset is built from its shape columns; one it lacks is named.
    ({"model": "Falcon-180B", "ffn_hidden": ""}, "'ffn_hidden'"),
    ({"precision": "nvfp4"}, "'precision'"),
    ({"recompute": "some"}, "'recompute'"),
    ({"fsdp_or_zero": "zero9"}, "'fsdp_or_zero'"),
    ({"measured_mfu": "lots"}, "'measured_mfu'"),
])
def test_bad_cells_name_their_column(rows, changes, column):
    run = parse_row(_row(rows, **changes))
    assert run.spec is None and "P001" in run.error and column in run.error, run.error


def test_spec_rule_errors_name_the_row(rows):
    # GPT3-5B (32 heads) with tp=3 on 48 GPUs: a RunSpec rule, reported for the row.
    run = parse_row(_row(rows, tp="3", num_gpus="48", dp="16"))
    assert run.spec is None and run.error.startswith("row P001:")
    assert "num_attention_heads=32" in run.error and "tp=3" in run.error


def test_reader_works_without_measured_columns(tmp_path: Path, rows):
    header = [k for k in rows[0] if not k.startswith("measured_")]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=header, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    path = tmp_path / "runs.csv"
    path.write_text(buf.getvalue())
    stripped = read_runs(path)
    full = read_runs(DEFAULT_PATH)
    assert len(stripped) == len(full)
    for a, b in zip(stripped, full):
        assert a.measured.tokens_per_s_per_gpu is None and a.measured.mfu is None
        assert (a.error is None) == (b.error is None), a.run_id
        if a.spec is not None:
            assert a.spec == b.spec, a.run_id


def test_unstated_mbs_is_the_fastest_that_fits(runs, rows):
    """Megatron-LM's README rows state the global batch but no micro-batch: each gets the
    candidate the projector with priors only finds fastest among those megatron-core's
    memory fits; a faster one that does not fit is never taken, and a stated MBS stays."""
    from primus_ext.memory.report import memory_report
    from primus_ext.project.estimate import project
    by_id = _by_id(runs)
    seen = set()
    for rid in ("P046", "P049", "P052", "P053"):
        spec = by_id[rid].spec
        assert memory_report(spec).fits
        chosen = project(spec, calibration=None).tokens_per_s_per_gpu
        dp = spec.cluster.world_size // spec.parallel.model_parallel_size
        for m in MBS_CANDIDATES:
            if m == spec.train.micro_batch_size or spec.train.global_batch_size % (m * dp):
                continue
            try:
                cand = replace(spec, train=replace(spec.train, micro_batch_size=m))
            except ValueError:
                continue
            if memory_report(cand).fits:
                assert project(cand, calibration=None).tokens_per_s_per_gpu <= chosen
            else:
                seen.add((rid, m))
        assert any(n.startswith("mbs empty: micro_batch_size=") for n in by_id[rid].notes)
    assert by_id["P049"].spec.train.micro_batch_size > 1
    assert ("P053", 2) in seen and by_id["P053"].spec.train.micro_batch_size == 1
    stated = parse_row({**next(r for r in rows if r["run_id"] == "P049"), "mbs": "1"})
    assert stated.spec.train.micro_batch_size == 1
    assert not any(n.startswith("mbs empty") for n in stated.notes)


def test_gbs_derived_from_measured_step_time(rows):
    row = _row(rows, "P093", measured_step_time_s="2.0")
    run = parse_row(row)
    # 2 s x 16224 tok/s/GPU x 8 GPUs / 8192 = 31.7 sequences -> a multiple of mbs*dp=16.
    assert run.spec.train.global_batch_size == 32
    assert any("derived from measured step time" in n for n in run.notes)


def test_layout_from_notes(rows):
    row = _row(rows, "P037", notes="decoder_first_pipeline_num_layers=1 "
               "decoder_last_pipeline_num_layers=4")
    run = parse_row(row)
    assert run.spec.layout.how == "first/last"
    assert run.spec.layout.layers_per_virtual_stage == (1,) + (4,) * 15


def test_missing_file_and_wrong_header(tmp_path: Path):
    with pytest.raises(ValueError, match="no such file"):
        read_runs(tmp_path / "absent.csv")
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="run_id"):
        read_runs(bad)


def test_documented_recipe_rules_reach_the_spec(runs, rows):
    """published_recipes.py: what a source documents beyond its columns, with a note."""
    by_id = _by_id(runs)
    dsv3 = by_id["P032"]  # Megatron-Bridge 25.09 DeepSeek-V3 on H100: DeepEP + a2a overlap
    p = dsv3.spec.parallel
    assert p.moe_token_dispatcher_type == "flex" and p.overlap_moe_expert_parallel_comm
    assert not p.grad_reduce_in_fp32 and p.tp_comm_overlap
    assert dsv3.spec.train.recompute_modules == ("mla_up_proj", "mlp")
    assert dsv3.spec.model.moe_router_num_groups == 8
    llama_paper = by_id["P090"].spec  # Llama 3 paper: V = 8, empty first / last chunks
    assert llama_paper.parallel.vpp == 8 and llama_paper.train.recompute_granularity is None
    assert llama_paper.layout.layers_per_virtual_stage[0] == 0
    assert llama_paper.layout.layers_per_virtual_stage[-1] == 0
    titan = by_id["P069"]  # torchtitan PP: microbatches = pp, so local batch 32 -> mbs 4
    assert titan.spec.train.micro_batch_size == 4 and titan.spec.num_microbatches == 8
    assert titan.spec.train.flash_attn_impl == "fa2"
    assert not by_id["P057"].spec.train.fused_elementwise  # eager
    assert by_id["P058"].spec.train.fused_elementwise  # torch.compile
    assert by_id["P070"].spec.parallel.vpp == 2  # Interleaved 1F1B: 2 stages per rank
    assert by_id["P063"].spec.parallel.cp_comm_type == "allgather"
    for run in (dsv3, by_id["P069"], by_id["P090"]):
        assert any("(" in n and "=" in n for n in run.notes)
    # A column the row fills wins over the recipe: a stated vp stays.
    run = parse_row(_row(rows, "P090", vp="1"))
    assert run.spec.parallel.vpp == 1


def test_without_mtp_rows_drop_the_mtp_layers(rows):
    run = parse_row(_row(rows, "P043", model="DeepSeek-V3 (w/o MTP)"))
    assert run.spec is not None and run.spec.model.mtp_num_layers == 0
    assert any("mtp_num_layers=0" in n for n in run.notes)


def test_shard_grad_op_rows_keep_parameters_gathered(runs):
    """llm-foundry's 1B / 3B large-scale rows ran FSDP SHARD_GRAD_OP (the README table's
    Sharding Strategy column; sweep.py --fsdp_config_shard_strategy): ZeRO-2, parameters
    kept gathered from the forward to the backward; FULL_SHARD rows reshard."""
    by = _by_id(runs)
    for rid, reshard in (("P080", False), ("P081", False), ("P079", True)):
        par = by[rid].spec.parallel
        assert par.fsdp and par.fsdp_reshard_after_forward is reshard, rid
