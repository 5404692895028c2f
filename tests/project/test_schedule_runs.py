"""A step that runs its microbatches as several pipeline schedules drains the pipeline
once per schedule.

NeMo AutoModel (github.com/NVIDIA-NeMo/Automodel @e45812012456
nemo_automodel/recipes/llm/benchmark.py) loops ``for ga_step_idx in range(ga_steps)``
and each ``_forward_backward_step`` calls ``self.pp.info.schedule.step(...)``: one
torch.distributed.pipelining schedule over local_batch_size / pp_microbatch_size
microbatches per gradient-accumulation step. Its DeepSeek-V3 1,024-GPU benchmark
(examples/benchmark/configs/deepseek_v3_te_deepep_1024.yaml @2c236e081: local batch 8,
pp_microbatch_size 1, global batch 8192 on 256 data-parallel ranks) runs 4 schedules of 8.
"""
from __future__ import annotations

import dataclasses

import pytest

from primus_ext import compose
from primus_ext.project.estimate import project
from primus_ext import published
from primus_ext.published import read_runs

BASE = ["model=llama3_8b", "model.num_layers=8", "parallel.pp=4", "parallel.vpp=2",
        "train.seq_length=2048", "train.micro_batch_size=1", "cluster.num_nodes=1",
        "cluster.hardware=h100"]


def _spec(gbs: int, per_schedule=None):
    spec = compose(BASE + [f"train.global_batch_size={gbs}"])
    return dataclasses.replace(spec, train=dataclasses.replace(
        spec.train, microbatches_per_schedule=per_schedule))


def test_each_schedule_fills_and_drains():
    one = project(_spec(16), calibration=None)  # 8 microbatches per rank (dp 2)
    four = project(_spec(64, 8), calibration=None)  # 4 schedules of 8
    merged = project(_spec(64), calibration=None)  # one schedule of 32
    b1, b4 = one.breakdown["pp_bubble_s"], four.breakdown["pp_bubble_s"]
    assert b4 == pytest.approx(4 * b1, rel=0.02)
    assert four.breakdown["compute_s"] == pytest.approx(4 * one.breakdown["compute_s"])
    assert merged.breakdown["pp_bubble_s"] < b4  # one fill and drain, not four
    assert four.step_time_s > merged.step_time_s


def test_schedule_must_divide_the_step():
    with pytest.raises(ValueError, match="microbatches_per_schedule"):
        project(_spec(64, 12), calibration=None)


def test_automodel_rows_take_their_schedule_size():
    by_id = {r.run_id: r for r in _published()}
    assert by_id["P109"].spec.train.microbatches_per_schedule == 8  # LBS 8, 4 schedules
    assert by_id["P109"].spec.num_microbatches == 32
    assert by_id["P110"].spec.train.microbatches_per_schedule == 8  # LBS 8, GA 1


def _published() -> list:
    """The published runs of the public set (the MoE rows among them)."""
    return read_runs(published.DEFAULT_PATH)
