"""A toy memory model and scorer for unit tests of the search machinery only.

They are smooth, deterministic functions of the layout with the shape of the real thing
(tensor parallelism costs communication, pipelines cost bubbles, recompute costs
compute, everything costs memory), so the strategies have something to find. The real
projector is exercised in test_recipe.py and tests/slow.
"""
from __future__ import annotations

from dataclasses import dataclass, field

GIB = 2**30


@dataclass
class FakeMemory:
    peak_bytes: int
    device_bytes: int

    @property
    def fits(self) -> bool:
        return self.peak_bytes <= self.device_bytes

    def to_dict(self) -> dict:
        return {"peak_bytes": self.peak_bytes, "device_bytes": self.device_bytes}


@dataclass
class FakeEstimate:
    step_time_s: float
    tokens_per_s_per_gpu: float
    tflops_per_gpu: float
    mfu: float
    breakdown: dict
    num_microbatches: int
    schedule: str = "1f1b"
    critical_stage: int = 0
    backend: str = "fake"
    memory: FakeMemory | None = None
    timeline: object = None
    notes: tuple = field(default_factory=tuple)


def fake_memory(spec) -> FakeMemory:
    p, t, m = spec.parallel, spec.train, spec.model
    params = 12 * m.num_layers * m.hidden_size ** 2
    shard = p.tp * p.pp
    state = params / shard * (2 + 2 + (12 / spec.dp if (p.use_distributed_optimizer or
                                                         p.fsdp) else 12))
    if p.fsdp:
        state = params / shard * 16 / spec.dp + 2 * params / shard / p.pp
    act_per_layer = 34 * t.seq_length * m.hidden_size * t.micro_batch_size / (p.tp * p.cp)
    rc = {None: 1.0, "selective": 0.7, "full": 0.08}[t.recompute_granularity]
    inflight = p.pp  # 1F1B keeps pp microbatches on the first stage
    act = act_per_layer * rc * m.num_layers / p.pp * inflight
    return FakeMemory(peak_bytes=int(state + act),
                      device_bytes=spec.cluster.hardware.hbm_bytes)


def fake_project(spec) -> FakeEstimate:
    p, t = spec.parallel, spec.train
    m = spec.num_microbatches
    tokens = spec.tokens_per_step
    flops = 6 * 12 * spec.model.num_layers * spec.model.hidden_size ** 2 * tokens
    peak = spec.cluster.hardware.bf16_tflops * 1e12
    eff = 0.75 * (1 - 0.04 * (p.tp - 1) ** 0.8) * (1 + 0.03 * min(t.micro_batch_size, 4))
    compute = flops / spec.world_size / (peak * eff)
    recompute = compute * {None: 0.0, "selective": 0.05, "full": 0.33}[
        t.recompute_granularity]
    tp_comm = compute * 0.02 * (p.tp - 1) * (0.5 if p.sequence_parallel else 1)
    cp_comm = compute * 0.03 * (p.cp - 1)
    bubble = (compute + recompute) * (p.pp - 1) / (m * p.vpp)
    dp_comm = 0.01 * (1.5 if p.fsdp else 1.0) + 0.002 * p.vpp
    step = compute + recompute + tp_comm + cp_comm + bubble + dp_comm
    mem = fake_memory(spec)
    tflops = flops / step / spec.world_size / 1e12
    return FakeEstimate(step_time_s=step, tokens_per_s_per_gpu=tokens / step / spec.world_size,
                        tflops_per_gpu=tflops, mfu=tflops * 1e12 / peak,
                        breakdown={"compute_s": compute, "recompute_s": recompute,
                                   "tp_comm_s": tp_comm, "cp_comm_s": cp_comm,
                                   "ep_comm_s": 0.0, "pp_bubble_s": bubble,
                                   "dp_comm_s": dp_comm, "optimizer_s": 0.0},
                        num_microbatches=m, memory=mem)
