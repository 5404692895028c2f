"""NeMo 1's distributed Adam (train.optimizer_impl='apex_distributed_fused_adam'): its
state bytes against a hand count from Apex's ``StateBucket.__init__`` (apex f9f19d5c
apex/contrib/optimizers/distributed_fused_adam.py lines 449-476) under the keyword
arguments NeMo r2.0.0rc1 ``MegatronBaseModel.setup_optimization`` passes (Apex has no
CPU build: source-derived, as memory/apex_adam.py says)."""
from __future__ import annotations

import dataclasses

import pytest

from primus_ext.memory.options import MemoryOptions
from primus_ext.memory.states import optimizer_bytes_per_element, stage_states
from primus_ext.presets import hardware_preset, model_preset
from primus_ext.project.optimizer import optimizer_step_s
from primus_ext.spec import ClusterSpec, ModelSpec, ParallelSpec, RunSpec, TrainSpec

APEX = "apex_distributed_fused_adam"


def _apex(dtype: str, **kw) -> TrainSpec:
    return TrainSpec(precision="bf16", optimizer_impl=APEX, exp_avg_dtype=dtype,
                     exp_avg_sq_dtype=dtype, **kw)


def test_state_bytes_follow_nemo_store_params_rules():
    # dtype fp32 over bf16 params: store_params=False, store_param_remainders=True ->
    # exp_avg_shard + exp_avg_sq_shard (fp32) + param_remainders_shard (int16).
    assert optimizer_bytes_per_element(_apex("fp32")) == 4 + 4 + 2
    # dtype == model dtype (bf16): store_params=False, no remainders -> two bf16 moments.
    assert optimizer_bytes_per_element(_apex("bf16")) == 2 + 2
    # fp16 state over bf16 params: store_params=True -> params_shard in fp16 too.
    assert optimizer_bytes_per_element(_apex("fp16")) == 2 + 2 + 2
    # FP8 runs keep bf16 weights (NeMo's autocast dtype): as bf16.
    fp8 = dataclasses.replace(_apex("fp32"), precision="fp8")
    assert optimizer_bytes_per_element(fp8) == 10
    # fp8_params: store_params=True, the master copy in dtype.
    assert optimizer_bytes_per_element(dataclasses.replace(fp8, fp8_param_gather=True)) \
        == 4 + 4 + 4
    # megatron-core's optimizer: fp32 master + two fp32 moments.
    assert optimizer_bytes_per_element(TrainSpec(precision="bf16")) == 12


def _spec(train: TrainSpec, **par) -> RunSpec:
    model = ModelSpec(**model_preset("llama2_7b"))
    return RunSpec(model=model, parallel=ParallelSpec(tp=1, pp=1, **par),
                   train=dataclasses.replace(train, global_batch_size=16,
                                             seq_length=4096),
                   cluster=ClusterSpec(hardware=hardware_preset("h100"), num_nodes=1))


def test_shards_as_the_distributed_optimizer_with_its_own_bytes():
    base = _spec(TrainSpec(precision="bf16"))
    for dtype, per in (("fp32", 10), ("bf16", 4)):
        apex = _spec(_apex(dtype))
        a = stage_states(apex.model, apex.parallel, apex.train, 0, 8, 8, MemoryOptions())
        b = stage_states(base.model, base.parallel, base.train, 0, 8, 8, MemoryOptions())
        assert a.optimizer_elements == b.optimizer_elements
        assert a.optimizer_bytes == per * b.optimizer_elements
        assert (a.param_bytes, a.grad_bytes) == (b.param_bytes, b.grad_bytes)
    # Apex's fused step moves less than megatron-core's 30 B per element.
    assert optimizer_step_s(_spec(_apex("bf16")), 1e9) < \
        optimizer_step_s(_spec(_apex("fp32")), 1e9) < optimizer_step_s(base, 1e9)


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="exp_avg_sq_dtype"):
        TrainSpec(optimizer_impl=APEX, exp_avg_dtype="bf16")
    with pytest.raises(ValueError, match="use_precision_aware_optimizer=false"):
        TrainSpec(optimizer_impl=APEX, use_precision_aware_optimizer=True)
    with pytest.raises(ValueError, match="optimizer_impl"):
        TrainSpec(optimizer_impl="zero3")
    with pytest.raises(ValueError, match="use_distributed_optimizer=true"):
        _spec(_apex("fp32"), use_distributed_optimizer=False)


def test_no_dummy_wgrads_without_megatron_ddp():
    # TE returns None for a fused-accumulation weight without megatron-core DDP's
    # grad_added_to_main_grad (TE v1.8 module/linear.py 591-608); NeMo 1's Apex optimizer
    # leaves the model unwrapped (megatron_gpt_model.py wraps in McoreDDP only for
    # mcore_distributed_optim).
    from primus_ext.memory.overhead import dummy_wgrad_bytes
    base, apex = _spec(TrainSpec(precision="bf16", te=True)), _spec(_apex("fp32", te=True))
    assert dummy_wgrad_bytes(base.model, base.parallel, base.train, 0) > 0
    assert dummy_wgrad_bytes(apex.model, apex.parallel, apex.train, 0) == 0
