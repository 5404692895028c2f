"""train.master_weights=false: the optimizer steps bf16 parameters and keeps its moments
in bf16 (NeMo AutoModel builds its models in bf16 and steps them with torch.optim.Adam).
The bytes are compared with torch's own Adam state on a bf16 module."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from primus_ext.memory.states import optimizer_bytes_per_element
from primus_ext.project.optimizer import optimizer_step_s
from primus_ext.published import read_runs
from primus_ext.spec.train import TrainSpec


def _adam_state_bytes_per_param(dtype: torch.dtype) -> float:
    lin = torch.nn.Linear(64, 32, bias=False, dtype=dtype)
    opt = torch.optim.Adam(lin.parameters(), lr=1e-3)
    lin(torch.randn(4, 64, dtype=dtype)).sum().backward()
    opt.step()
    state = opt.state[lin.weight]
    moments = [v for k, v in state.items() if k != "step"]
    return sum(t.numel() * t.element_size() for t in moments) / lin.weight.numel()


def test_bf16_adam_moments_match_torch():
    train = TrainSpec(precision="bf16", master_weights=False)
    assert optimizer_bytes_per_element(train) == _adam_state_bytes_per_param(torch.bfloat16)
    # With master weights megatron-core keeps fp32 main params and fp32 moments.
    assert optimizer_bytes_per_element(TrainSpec(precision="bf16")) == \
        4 + _adam_state_bytes_per_param(torch.float32)


def test_master_weights_false_needs_mixed_precision():
    with pytest.raises(ValueError, match="train.master_weights"):
        TrainSpec(precision="fp32", master_weights=False)
    with pytest.raises(ValueError, match="train.master_weights"):
        TrainSpec(precision="bf16", master_weights=False, use_precision_aware_optimizer=True)


def test_automodel_rows_have_no_master_weights_and_fit():
    runs = [r for r in read_runs() if r.spec is not None
            and r.row["source"].startswith("NeMo-Automodel")]
    assert len(runs) >= 3
    from primus_ext.memory.report import memory_report
    for r in runs:
        assert r.spec.train.master_weights is False, r.run_id
        assert any("master_weights" in n for n in r.notes), r.run_id
        # Every one of them ran on 80 GB H100s.
        assert memory_report(r.spec).fits, r.run_id
        with_master = dataclasses.replace(r.spec, train=dataclasses.replace(
            r.spec.train, master_weights=True))
        assert optimizer_step_s(r.spec, 1e9) < optimizer_step_s(with_master, 1e9)
