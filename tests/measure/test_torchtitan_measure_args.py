"""The torchtitan measurement's command-line handling and model dims (no torchtitan
needed): the measured layout replaces the user's, the CPU flags are added once and before
the activation-checkpoint subcommand (tyro wants it last), bad dims are refused."""
from __future__ import annotations

import pytest

pytest.importorskip("torch")

from patches.torchtitan_apply import CPU_FLAGS, with_cpu_flags  # noqa: E402
from primus_ext.frameworks.torchtitan.build import ModelDims  # noqa: E402
from primus_ext.frameworks.torchtitan.measure import strip_flags  # noqa: E402

LINE = ["--module", "llama3", "--config", "llama3_8b",
        "--parallelism.tensor_parallel_degree", "2", "--training.seq_len=8192",
        "--compile.enable", "activation-checkpoint:selective"]


def test_strip_flags_drops_layout_and_subcommand():
    out = strip_flags(LINE)
    assert out == ["--module", "llama3", "--config", "llama3_8b", "--compile.enable"]


def test_cpu_flags_go_before_the_subcommand_once(monkeypatch):
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = with_cpu_flags(LINE)
    assert out[-1] == "activation-checkpoint:selective"
    for flag in CPU_FLAGS:
        assert out.count(flag) == 1
    assert with_cpu_flags(out) == out  # idempotent


def test_cpu_flags_untouched_on_cuda(monkeypatch):
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert with_cpu_flags(LINE) == LINE


def test_model_dims_validation():
    good = dict(num_layers=2, hidden_size=64, num_attention_heads=4, num_query_groups=2,
                ffn_hidden_size=128, vocab_size=256)
    assert ModelDims.from_json(ModelDims(**good).to_json()) == ModelDims(**good)
    with pytest.raises(ValueError, match="num_query_groups=3"):
        ModelDims(**{**good, "num_query_groups": 3})
    with pytest.raises(ValueError, match="hidden_size=66"):
        ModelDims(**{**good, "hidden_size": 66})
    with pytest.raises(ValueError, match="vocab_size=0"):
        ModelDims(**{**good, "vocab_size": 0})
