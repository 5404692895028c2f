"""The precision-aware optimizer's byte counts (memory/te_states.py) rest on megatron-core
defaults; these are read from the installed megatron-core's own OptimizerConfig on the
CPU. The optimizer itself (TE's FusedAdam) has no CPU build, so its state bytes are
source-derived (tests/memory/test_memory_te.py)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
optimizer_config = pytest.importorskip("megatron.core.optimizer.optimizer_config")

from primus_ext.memory.te_states import DTYPE_BYTES  # noqa: E402


def test_megatron_core_optimizer_defaults_match_the_model():
    cfg = optimizer_config.OptimizerConfig(bf16=True)
    # int16 master remainders for bf16 parameters: 2 bytes, not 4.
    assert cfg.store_param_remainders is True
    assert not cfg.use_precision_aware_optimizer
    for f in ("main_grads_dtype", "main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype"):
        assert getattr(cfg, f) == torch.float32
    assert DTYPE_BYTES["fp32"] == torch.tensor([], dtype=torch.float32).element_size()
    assert DTYPE_BYTES["bf16"] == torch.tensor([], dtype=torch.bfloat16).element_size()
    assert DTYPE_BYTES["fp8"] == torch.tensor([], dtype=torch.uint8).element_size()
