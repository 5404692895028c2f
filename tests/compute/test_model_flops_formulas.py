"""Model FLOPs per token against Megatron-LM's own formulas: the current one (causal
attention halved) and core_r0.8.0's (megatron/training/training.py
num_floating_point_operations, attention over the whole sequence), by which the
Megatron-LM README tables were computed."""
from __future__ import annotations

import pytest

from primus_ext.compute.model_flops import model_flops_per_token
from primus_ext.published import read_runs


def r080_flops_per_token(m, s: int) -> float:
    """core_r0.8.0 num_floating_point_operations / (batch * seq), transcribed."""
    h, a, g, layers = m.hidden_size, m.num_attention_heads, m.num_groups, m.num_layers
    ratio = m.head_dim * a / h
    gated = 3 / 2 if m.gated else 1
    return 12 * layers * h * h * ((1 + g / a + s / h) * ratio + m.dense_ffn_size / h * gated
                                  + m.padded_vocab_size / (2 * layers * h))


@pytest.mark.parametrize("run_id", ["P046", "P049", "P054"])
def test_full_attention_formula_is_megatron_r080s(run_id):
    run = next(r for r in read_runs() if r.run_id == run_id)
    m, s = run.spec.model, run.spec.train.seq_length
    assert not run.flops_causal_halved
    assert model_flops_per_token(m, s, False) == pytest.approx(r080_flops_per_token(m, s),
                                                               rel=1e-9)
    # The causal formula counts half the core-attention FLOPs: 6 * s * heads * head_dim
    # per layer less.
    diff = model_flops_per_token(m, s, False) - model_flops_per_token(m, s)
    assert diff == pytest.approx(6 * s * m.num_attention_heads * m.head_dim * m.num_layers)
