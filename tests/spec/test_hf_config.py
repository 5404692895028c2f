"""Models read from Hugging Face config.json files against their model cards.

Every file under tests/data/hf_configs/ is a real model's config.json (sources in that
folder's README). ``model=hf`` must reproduce the total (and, for MoE, active) parameter
count its model card publishes within 1 % (or one unit of the printed figure's last
digit, as tests/spec/test_presets.py counts). Where a hand-written preset exists for the
same model, the reader must build exactly the preset's spec.
"""
from __future__ import annotations

import dataclasses
import json
from decimal import Decimal
from pathlib import Path

import pytest

from primus_ext.memory.params import count_params, embedding_groups
from primus_ext.presets import list_presets, model_preset
from primus_ext.presets.hf_config import SUPPORTED, fields_from_hf, model_from_hf
from primus_ext.spec import ModelSpec

DATA = Path(__file__).resolve().parents[1] / "data" / "hf_configs"

# Model card figures in billions: (total, active or None, active convention, source).
# "no_input_emb": the active figure leaves out the input embedding table (gpt-oss model
# card Table 1, DeepSeek-V3 report), as in test_presets.py.
CARDS = {
    "llama-3.1-8b": ("8.03", None, "", "HF meta-llama/Llama-3.1-8B model card (8.03B)"),
    "llama-3.2-3b": ("3.21", None, "", "HF meta-llama/Llama-3.2-3B model card (3.21B)"),
    "qwen2.5-3b": ("3.09", None, "", "HF Qwen/Qwen2.5-3B model card (3.09B)"),
    "qwen2.5-7b": ("7.61", None, "", "HF Qwen/Qwen2.5-7B model card (7.61B)"),
    "qwen2.5-14b": ("14.7", None, "", "HF Qwen/Qwen2.5-14B model card (14.7B)"),
    "qwen2.5-32b": ("32.5", None, "", "HF Qwen/Qwen2.5-32B model card (32.5B)"),
    "qwen3-4b": ("4.0", None, "", "HF Qwen/Qwen3-4B model card (4.0B)"),
    "qwen3-8b": ("8.2", None, "", "HF Qwen/Qwen3-8B model card (8.2B)"),
    "qwen3-14b": ("14.8", None, "", "HF Qwen/Qwen3-14B model card (14.8B)"),
    "qwen3-32b": ("32.8", None, "", "HF Qwen/Qwen3-32B model card (32.8B)"),
    "qwen3-30b-a3b": ("30.5", "3.3", "with_emb",
                      "HF Qwen/Qwen3-30B-A3B model card (30.5B total, 3.3B activated)"),
    "mixtral-8x7b": ("46.7", "12.9", "with_emb", "mistral.ai/news/mixtral-of-experts "
                     "(46.7B total, 12.9B per token)"),
    "qwen2-57b-a14b": ("57", "14", "with_emb", "HF Qwen/Qwen2-57B-A14B model card and "
                       "arXiv:2407.10671 Table 1 (57B total, 14B activated)"),
    "deepseek-v3": ("671", "37", "no_input_emb",
                    "arXiv:2412.19437 Sec. 1 (671B total, 37B activated)"),
    "gpt-oss-20b": ("20.91", "3.61", "no_input_emb",
                    "gpt-oss model card arXiv:2508.10925 Table 1 (20.91B, 3.61B active)"),
}
# The same model as a hand-written preset: the reader must build the identical spec.
PRESET_OF = {"llama-3.1-8b": "llama3.1_8b", "qwen2.5-7b": "qwen2.5_7b",
             "mixtral-8x7b": "mixtral_8x7b",
             "qwen3-14b": "qwen3_14b", "qwen3-32b": "qwen3_32b",
             "qwen3-30b-a3b": "qwen3_30b_a3b", "deepseek-v3": "deepseek_v3",
             "gpt-oss-20b": "gpt_oss_20b"}


def _close(ours_b: float, printed: str) -> bool:
    value = float(printed)
    unit = float(Decimal(1).scaleb(Decimal(printed).as_tuple().exponent))
    return abs(ours_b - value) <= max(0.01 * value, unit)


def _spec(name: str) -> ModelSpec:
    fields, _ = model_from_hf(DATA / name)
    return ModelSpec(**fields)


def test_every_kept_config_has_a_card_figure_and_a_cited_source():
    dirs = {p.name for p in DATA.iterdir() if p.is_dir()}
    assert dirs == set(CARDS) and len(dirs) >= 8
    readme = (DATA / "README.md").read_text()
    for name in dirs:
        assert f"`{name}/`" in readme, f"{name} has no source in the README"


@pytest.mark.parametrize("name", sorted(CARDS))
def test_total_and_active_params_match_the_model_card(name):
    total, active, convention, source = CARDS[name]
    model = _spec(name)
    counts = count_params(model)
    assert _close(counts.num_params / 1e9, total), (
        f"{name}: {counts.num_params / 1e9:.3f}B vs card {total}B ({source})")
    if active is not None:
        ours = counts.num_active_params
        if convention == "no_input_emb":
            ours -= embedding_groups(model)[0].num_params
        assert _close(ours / 1e9, active), (
            f"{name}: active {ours / 1e9:.3f}B vs card {active}B ({source})")


@pytest.mark.parametrize("name", sorted(PRESET_OF))
def test_reader_builds_the_hand_written_preset(name):
    preset = PRESET_OF[name]
    ours = dataclasses.replace(_spec(name), name=preset)
    assert ours == ModelSpec(**model_preset(preset))


def test_features_seen_in_the_kept_files():
    qwen25, qwen3 = _spec("qwen2.5-7b"), _spec("qwen3-8b")
    assert qwen25.add_qkv_bias and not qwen25.qk_layernorm and qwen25.num_groups == 4
    assert qwen3.qk_layernorm and qwen3.head_dim == 128 and not qwen3.add_qkv_bias
    assert not _spec("llama-3.2-3b").untie_embeddings_and_output_weights  # tied
    assert _spec("llama-3.1-8b").untie_embeddings_and_output_weights
    ds = _spec("deepseek-v3")
    assert ds.multi_latent_attention and ds.q_lora_rank == 1536 and ds.mtp_num_layers == 1
    assert ds.moe_first_k_dense == 3 and ds.num_moe_layers == 58
    assert ds.moe_shared_expert_intermediate_size == 2048
    assert (ds.moe_router_num_groups, ds.moe_router_group_topk) == (8, 4)
    qmoe = _spec("qwen2-57b-a14b")
    assert qmoe.moe_shared_expert_intermediate_size == 20480 and qmoe.add_qkv_bias
    assert qmoe.num_moe_layers == 28 and qmoe.window_size is None  # use_sliding_window off
    oss = _spec("gpt-oss-20b")
    assert oss.window_size == 128 and oss.uses_window(0) and not oss.uses_window(1)
    assert oss.add_bias_linear and oss.num_moe_experts == 32 and oss.moe_router_topk == 4


def test_every_key_of_a_file_is_read_or_said():
    for d in sorted(DATA.iterdir()):
        if not d.is_dir():
            continue
        cfg = json.loads((d / "config.json").read_text())
        _, notes = fields_from_hf(cfg)
        assert not any(n.startswith("not read") for n in notes), (d.name, notes)
    cfg = {**json.loads((DATA / "qwen3-8b" / "config.json").read_text()),
           "fancy_new_thing": 3}
    _, notes = fields_from_hf(cfg)
    assert any(n.startswith("not read") and "fancy_new_thing" in n for n in notes)


def _base(model_type: str, **extra) -> dict:
    return {"model_type": model_type, "num_hidden_layers": 4, "hidden_size": 256,
            "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000,
            "max_position_embeddings": 4096, "intermediate_size": 512, **extra}


def test_windows_follow_each_familys_layer_pattern():
    # Mistral windows every layer (MistralAttention: sliding_window on all layers).
    f, _ = fields_from_hf(_base("mistral", sliding_window=64))
    m = ModelSpec(name="m", **f)
    assert all(m.uses_window(i) for i in range(4))
    # Gemma2 windows the even layers (Gemma2DecoderLayer: not layer_idx % 2).
    f, notes = fields_from_hf(_base("gemma2", sliding_window=64, head_dim=64,
                                    hidden_activation="gelu_pytorch_tanh"))
    g = ModelSpec(name="g", **f)
    assert [g.uses_window(i) for i in range(4)] == [True, False, True, False]
    assert not g.untie_embeddings_and_output_weights  # Gemma ties by default
    assert any("GELU" in n for n in notes) and any("post-feedforward" in n for n in notes)
    f, _ = fields_from_hf(_base("mixtral", num_local_experts=8, num_experts_per_tok=2))
    assert "window_size" not in f and f["num_moe_experts"] == 8
    irregular = ["sliding_attention", "full_attention", "full_attention",
                 "sliding_attention"]
    with pytest.raises(ValueError, match="layer_types is not periodic"):
        fields_from_hf(_base("gpt_oss", sliding_window=8, layer_types=irregular,
                             num_local_experts=4, num_experts_per_tok=2))


def test_qwen2_moe_shared_expert_and_multimodal_gemma3():
    f, notes = fields_from_hf(_base("qwen2_moe", num_experts=8, num_experts_per_tok=2,
                                    moe_intermediate_size=64,
                                    shared_expert_intermediate_size=256))
    assert f["moe_shared_expert_intermediate_size"] == 256 and f["add_qkv_bias"]
    assert any("sigmoid gate" in n for n in notes)
    outer = {"model_type": "gemma3", "vision_config": {"hidden_size": 8},
             "text_config": _base("gemma3_text", head_dim=64, sliding_window=16,
                                  sliding_window_pattern=2)}
    f, notes = fields_from_hf(outer)
    assert f["qk_layernorm"] and f["window_full_attention_every"] == 2
    assert any("vision tower" in n for n in notes)
    flat, _ = fields_from_hf({**outer["text_config"], "model_type": "gemma3"})
    assert flat == f


def test_errors_name_the_field_and_the_rule(tmp_path):
    with pytest.raises(ValueError) as exc:
        fields_from_hf(_base("falcon"))
    msg = str(exc.value)
    assert "model_type='falcon'" in msg and all(t in msg for t in SUPPORTED)
    cfg = _base("llama")
    del cfg["num_hidden_layers"]
    with pytest.raises(ValueError, match="num_hidden_layers is missing"):
        fields_from_hf(cfg)
    with pytest.raises(ValueError, match="no config.json there"):
        model_from_hf(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="not a readable JSON file"):
        model_from_hf(tmp_path)


def test_hydra_model_hf_reads_the_file_and_takes_overrides():
    from primus_ext.config import compose_cfg, model_and_notes
    path = DATA / "qwen3-30b-a3b"
    model, notes = model_and_notes(compose_cfg(["model=hf", f"model.hf_config={path}"]))
    assert model == _spec("qwen3-30b-a3b")
    assert notes and all(n.startswith("model.hf_config: ") for n in notes)
    model, _ = model_and_notes(compose_cfg(["model=hf", f"model.hf_config={path}/config.json",
                                            "+model.num_layers=4", "model.name=small"]))
    assert (model.num_layers, model.name) == (4, "small")
    with pytest.raises(ValueError, match="model=hf needs model.hf_config"):
        model_and_notes(compose_cfg(["model=hf"]))
    assert "hf" not in list_presets("model")
