"""The published-run reader on rows a person reads without trouble: a model with no
preset built from its shape columns, facts stated in columns (and notes read with their
negation), torchtitan's op-level selective label, a recompute cell listing modules, an
empty tp or pp."""
from __future__ import annotations

import csv

import pytest

from primus_ext.memory.params import count_params
from primus_ext.presets import model_preset
from primus_ext.published import DEFAULT_PATH
from primus_ext.published.reader import parse_row, read_runs
from primus_ext.spec import ModelSpec

# BLOOM-176B as trained (github.com/liguodongiot/llm-action docs/llm-base/distribution-
# parallelism/multidimensional-hybrid-parallel/README.md, quoting bigscience-workshop/
# bigscience train/tr11-176B-ml/tr11-176B-ml.slurm: 384 A100 80GB, TP 4, PP 12, DP 8,
# ZeRO-1, MICRO_BATCH_SIZE=2, GLOBAL_BATCH_SIZE=2048, NHIDDEN=14336, NLAYERS=70,
# NHEADS=112, vocabulary 250,680; arXiv:2211.05100: 176B parameters, GeLU, LayerNorm,
# ALiBi, tied embeddings). No preset exists for it.
BLOOM = {"run_id": "T1", "source": "bigscience-tr11", "source_detail": "tr11-176B-ml",
         "model": "BLOOM-176B", "arch": "dense", "params_total_b": "176", "layers": "70",
         "hidden": "14336", "ffn_hidden": "57344", "heads": "112", "kv_heads": "",
         "vocab": "250680", "seq_len": "2048", "gpu": "A100", "num_gpus": "384",
         "precision": "bf16", "tp": "4", "pp": "12", "vp": "", "cp": "", "ep": "",
         "etp": "", "dp": "8", "mbs": "2", "gbs": "2048", "recompute": "",
         "fsdp_or_zero": "zero1", "position_embedding": "alibi", "notes": ""}


def _row(run_id: str, path=DEFAULT_PATH) -> dict:
    with open(path, newline="") as f:
        return next(r for r in csv.DictReader(f) if r["run_id"] == run_id)


def test_a_model_without_preset_is_built_from_its_columns():
    run = parse_row(BLOOM)
    assert run.error is None and run.model_preset is None
    m = run.spec.model
    assert (m.num_layers, m.hidden_size, m.num_attention_heads) == (70, 14336, 112)
    assert m.position_embedding_type == "alibi" and m.activation == "gelu"
    assert not m.untie_embeddings_and_output_weights
    # BLOOM's published size: 176,247,271,424 parameters (HF bigscience/bloom).
    assert count_params(m).num_params == pytest.approx(176.247e9, rel=0.01)
    assert any("no preset; built from the row's shape columns" in n for n in run.notes)
    assert not any("the row states" in n for n in run.notes)  # the size agrees


def test_columns_rebuild_a_preset_model_exactly():
    # Mixtral-8x7B's shape under a name that matches no preset, its architecture stated
    # in columns: the same parameter count as the mixtral_8x7b preset.
    row = {**BLOOM, "model": "SomeMoE-8x7B", "arch": "moe", "params_total_b": "46.7",
           "layers": "32", "hidden": "4096", "ffn_hidden": "", "heads": "32",
           "kv_heads": "8", "vocab": "32000", "num_experts": "8", "topk": "2",
           "moe_ffn_hidden": "14336", "activation": "swiglu", "normalization": "RMSNorm",
           "position_embedding": "rope", "tied_embeddings": "false",
           "bias_linear": "false", "num_gpus": "64", "tp": "2", "pp": "4", "dp": "",
           "ep": "8", "mbs": "1", "gbs": "256", "seq_len": "4096"}
    run = parse_row(row)
    assert run.error is None, run.error
    preset = ModelSpec(**model_preset("mixtral_8x7b"))
    assert count_params(run.spec.model) == count_params(preset)


def test_empty_architecture_columns_take_the_convention_the_stated_size_implies():
    # The same Mixtral-8x7B row with every architecture column empty, as the public
    # tables print it: Megatron-LM's defaults (GeLU, no gate) would build a 32.2B model,
    # the LlamaConfig convention the mixtral_8x7b preset's (HF config.json) 46.7B.
    arch = ("activation", "normalization", "position_embedding", "tied_embeddings",
            "bias_linear")
    row = {**BLOOM, "model": "SomeMoE-8x7B", "arch": "moe", "params_total_b": "46.7",
           "layers": "32", "hidden": "4096", "ffn_hidden": "", "heads": "32",
           "kv_heads": "8", "vocab": "32000", "num_experts": "8", "topk": "2",
           "moe_ffn_hidden": "14336", "num_gpus": "64", "tp": "2", "pp": "4", "dp": "",
           "ep": "8", "mbs": "1", "gbs": "256", "seq_len": "4096",
           **{c: "" for c in arch}}
    run = parse_row(row)
    assert run.error is None, run.error
    preset = ModelSpec(**model_preset("mixtral_8x7b"))
    assert count_params(run.spec.model) == count_params(preset)
    assert any("the LlamaConfig convention taken" in n for n in run.notes)
    # BLOOM states its ALiBi position column: Megatron-LM's defaults fill the rest.
    bloom = parse_row(BLOOM)
    assert bloom.spec.model.activation == "gelu"
    assert not any("convention taken" in n for n in bloom.notes)
    # Without a stated size the launch-line defaults stand.
    plain = parse_row({**row, "params_total_b": ""})
    assert plain.spec.model.activation == "gelu"


@pytest.mark.parametrize("column", ["layers", "hidden", "heads", "vocab", "ffn_hidden"])
def test_a_missing_shape_column_is_named(column):
    run = parse_row({**BLOOM, column: ""})
    assert run.spec is None and f"column {column!r}" in run.error
    moe = parse_row({**BLOOM, "num_experts": "8", "topk": "2", "moe_ffn_hidden": ""})
    assert "column 'moe_ffn_hidden'" in moe.error


def test_a_bad_architecture_cell_and_a_size_mismatch_are_said():
    run = parse_row({**BLOOM, "activation": "tanh"})
    assert "column 'activation'" in run.error and "swiglu" in run.error
    run = parse_row({**BLOOM, "params_total_b": "100"})
    assert any("the row states 100B" in n for n in run.notes)


def test_an_empty_tp_or_pp_is_one_with_a_note():
    run = parse_row({**BLOOM, "tp": "", "pp": "48", "dp": ""})
    assert run.error is None and run.spec.parallel.tp == 1
    assert "tp empty: 1 assumed (the other parallel column is given)" in run.notes


def test_notes_are_read_with_their_negation_and_columns_win():
    row = {k: v for k, v in _row("P068").items()
           if k not in ("compile", "tp_comm_overlap", "pp_schedule")}
    assert "torch.compile" in row["notes"] and "AsyncTP" in row["notes"]
    on = parse_row(row).spec
    assert on.train.compile and on.parallel.tp_comm_overlap
    off = parse_row({**row, "notes": "FSDP32+TP8; torch.compile off; no AsyncTP"}).spec
    assert not off.train.compile and not off.parallel.tp_comm_overlap
    off = parse_row({**row, "notes": "without torch.compile"}).spec
    assert not off.train.compile
    stated = parse_row({**row, "notes": "torch.compile off", "compile": "true",
                        "tp_comm_overlap": "true"}).spec
    assert stated.train.compile and stated.parallel.tp_comm_overlap
    assert "'compile'" in parse_row({**row, "compile": "maybe"}).error


def test_bundled_rows_state_their_facts_in_columns():
    for run in read_runs(DEFAULT_PATH):
        assert run.error is None, run.error
        if "torchtitan" in run.source.lower():
            assert not any("read from the row's notes" in n for n in run.notes), run.run_id
    p070 = next(r for r in read_runs(DEFAULT_PATH) if r.run_id == "P070")
    assert p070.spec.parallel.schedule == "Interleaved1F1B"


def test_torchtitan_op_level_selective_label():
    row = {**_row("P057"), "recompute": "selective(per-op)"}
    run = parse_row(row)
    assert run.error is None and run.spec.train.activation_checkpoint == "selective"
    assert parse_row({**row, "recompute": "full, block, 4 layers"}).error


def test_a_recompute_cell_listing_modules_is_recompute_modules():
    row = {k: v for k, v in _row("P098").items()}
    run = parse_row({**row, "recompute": "norm, act"})
    assert run.error is None
    t = run.spec.train
    assert t.recompute_granularity == "selective"
    assert set(t.recompute_modules) == {"layernorm", "moe_act"}


def test_fp8_recipe_is_a_column():
    row = _row("P021")
    assert row["fp8_recipe"] == "tensorwise"
    run = parse_row({**row, "fp8_recipe": "mxfp8"})
    assert run.spec.train.fp8_recipe == "mxfp8"
    assert "fp8_recipe=mxfp8 (column fp8_recipe)" in run.notes
    assert "'fp8_recipe'" in parse_row({**row, "fp8_recipe": "nvfp4"}).error
    assert "needs precision fp8" in parse_row({**row, "precision": "bf16"}).error
