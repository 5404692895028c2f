"""The hybrid measurement of a real torchtitan run: the collectives its profile captured
against the comm model's list for the same layout.

Two processes (gloo, one thread each) run ``run_measurement`` of a tiny llama3 target;
the measured layout keeps both: FSDP2 over 2 shards, or TP 2 with SP. The profile's
collectives are per layer and microbatch; summed over the layer kinds they are the bytes
one microbatch moves, which the comm model lists per kind (``simulate_layer_costs``).
"""
from __future__ import annotations

import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("torchtitan")

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
_TORCHRUN_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                  "MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT")
# The measured torchtitan run reduces gradients in fp32 (FSDP2's MixedPrecisionPolicy
# reduce_dtype, torchtitan's training.mixed_precision_reduce = "float32"): the spec that
# describes it states so (unstated, a config takes the Megatron recipes' bf16 reduce).
BASE = ["model=tiny_dense", "model.num_layers=2", "model.vocab_size=512",
        "train.seq_length=128", "cluster.hardware=cpu", "cluster.num_nodes=1",
        "cluster.gpus_per_node=2", "parallel.grad_reduce_in_fp32=true"]


def _measure(tmp_path, overrides: list[str], flags: list[str], init_first: bool = False):
    from primus_ext.project.profile import Profile
    out = tmp_path / "profile.json"
    env = {k: v for k, v in os.environ.items() if k not in _TORCHRUN_VARS}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    res = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                          "--nproc-per-node=2", str(ROOT / "tests/slow/torchtitan_measure.py"),
                          *(["--init-first"] if init_first else []), str(out),
                          " ".join(overrides), *flags],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-4000:]
    return Profile.load(out)


def _per_microbatch(profile, axis: str) -> dict:
    got = defaultdict(float)
    for c in profile.collectives:
        if c.axis != axis or c.kind == "step":
            continue
        n = profile.layers[c.kind].num_layers
        got[(c.collective, c.phase)] += c.count * c.num_bytes * n
    return got


def _model(spec, axis: str) -> tuple[dict, dict]:
    from primus_ext.project.simulate_backend import simulate_layer_costs
    costs = simulate_layer_costs(spec)
    per_kind = {"dense": spec.model.num_layers, "embedding": 1, "output": 1}
    total, by_kind = defaultdict(float), defaultdict(float)
    for kind, lc in costs.kinds.items():
        for op in lc.comms:
            if op.axis == axis:
                total[(op.collective, op.phase)] += op.num_bytes * per_kind.get(kind, 0)
                by_kind[(kind, op.collective, op.phase)] += op.num_bytes
    return total, by_kind


def test_fsdp2_collectives_match_comm_model(tmp_path):
    import primus_ext
    overrides = BASE + ["parallel.fsdp=true", "train.micro_batch_size=1",
                        "train.global_batch_size=4"]
    # As under a drop-in: the process group exists before the measurement, which reuses it.
    prof = _measure(tmp_path, overrides, ["--parallelism.data_parallel_shard_degree", "2"],
                    init_first=True)
    spec = primus_ext.compose(overrides)
    got = _per_microbatch(prof, "dp")
    want, by_kind = _model(spec, "dp")
    ops = {c.op for c in prof.collectives if c.axis == "dp"}
    assert {"all_gather_single", "reduce_scatter_single"} <= ops, ops
    # Gradients: one fp32 reduce-scatter per FSDP2 unit and microbatch, byte for byte
    # (the lm_head's is issued inside the chunked loss's forward; the phase differs).
    rs_got = got[("reduce_scatter", "fwd")] + got[("reduce_scatter", "bwd")]
    assert rs_got == want[("reduce_scatter", "bwd")]
    # Parameters gathered again in backward (resharded after forward), byte for byte.
    assert got[("all_gather", "bwd")] == want[("all_gather", "bwd")]
    # Forward: the comm model's gathers plus the output unit (final norm + lm_head)
    # gathered a second time: torchtitan's ChunkedLossWrapper calls the lm_head after the
    # model part's forward has resharded it.
    assert got[("all_gather", "fwd")] == want[("all_gather", "fwd")] + \
        by_kind[("output", "all_gather", "fwd")]


def test_tp2_functional_collectives_against_comm_model(tmp_path):
    import primus_ext
    overrides = BASE + ["parallel.tp=2", "parallel.sequence_parallel=true",
                        "train.micro_batch_size=1", "train.global_batch_size=2"]
    prof = _measure(tmp_path, overrides, ["--parallelism.data_parallel_shard_degree", "1",
                                          "--parallelism.tensor_parallel_degree", "2"])
    spec = primus_ext.compose(overrides)
    tp = [c for c in prof.collectives if c.axis == "tp"]
    assert tp and all(c.op.startswith("_c10d_functional.") for c in tp), \
        [(c.op, c.axis) for c in prof.collectives]
    assert prof.measured_parallel["tp"] == 2
    _, want = _model(spec, "tp")
    got = defaultdict(float)
    for c in tp:
        if c.kind == "dense":
            got[(c.collective, c.phase)] += c.count * c.num_bytes
    # Sequence parallelism per block: the forward's all-gathers and reduce-scatters and
    # the backward's reduce-scatters are the comm model's, byte for byte.
    for key in (("all_gather", "fwd"), ("reduce_scatter", "fwd"), ("reduce_scatter", "bwd")):
        assert got[key] == want[("dense",) + key], key
    # Backward all-gathers: DTensor keeps the gathered input of each linear for its weight
    # gradient, so only the input-gradient gathers remain: half of megatron-core's
    # (which gathers the input again for the weight gradient).
    assert got[("all_gather", "bwd")] == want[("dense", "all_gather", "bwd")] / 2
    # The replicated norm weights' gradients are all-reduced inside the block's backward
    # (two norms, bf16), which megatron-core does once per step instead.
    assert got[("all_reduce", "bwd")] == 2 * spec.model.hidden_size * 2
