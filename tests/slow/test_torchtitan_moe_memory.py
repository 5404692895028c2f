"""A real torchtitan MoE model on this CPU: ``--module deepseek_v3 --config
deepseek_v3_debugmodel`` (MLA, 8 routed + 2 shared experts, layer 0 dense; 33,014,016
parameters) with EP 2 beside FSDP2 over 2 processes (gloo; the token all-to-all runs),
one training step, each rank's tensors counted (frameworks/torchtitan/measure_memory.py),
against the memory model of the same line.

Asserted: the fp32 parameter shard (dense over ``fsdp`` = 2, experts split over ``ep`` = 2
with ``efsdp`` = 1), the AdamW moments, and the unsharded bf16 units in flight (the model
holds two, the unit computed and the one prefetched; the CPU run has no prefetch stream
and holds one: the measured peak is one unit). Activations are printed, not asserted:
on the CPU attention runs through SDPA's math path in fp32 (its probabilities and fp32
q/k/v are saved), which a GPU's flash kernel does not keep.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("torchtitan")

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
LINE = ["--module", "deepseek_v3", "--config", "deepseek_v3_debugmodel",
        "--parallelism.expert_parallel_degree", "2", "--training.disable_cuda_graphs",
        "--training.local_batch_size", "1", "--training.seq_len", "256"]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    tmp = tmp_path_factory.mktemp("moe_mem")
    out = tmp / "mem.json"
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           "--master-port", str(port), "-m", "primus_ext.frameworks.torchtitan.measure_memory",
           "--out", str(out), "--assets", str(tmp / "assets"), *LINE,
           "--training.steps", "1", "--metrics.log_freq", str(10 ** 6),
           "--dump_folder", str(tmp / "dump"), "activation-checkpoint:none"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    for _ in range(2):  # torch 2.13 CPU/gloo ranks now and then abort while exiting
        r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=600)
        if r.returncode == 0 and out.is_file():
            return json.loads(out.read_text())["ranks"]
        out.unlink(missing_ok=True)
    raise AssertionError(r.stderr[-4000:])


def _model():
    import primus_ext
    from primus_ext.frameworks.torchtitan.flags import parse_titan, to_overrides
    ta = parse_titan(LINE + ["activation-checkpoint:none"])
    spec = primus_ext.compose(to_overrides(ta, 6, 2) + [
        "cluster.hardware=cpu", "cluster.num_nodes=1", "cluster.gpus_per_node=2"])
    return spec, primus_ext.memory(spec).stages[0]


def test_states_match_the_real_moe_run(ranks):
    spec, st = _model()
    assert (spec.parallel.ep, spec.dp, spec.model.name) == (2, 2, "deepseek_v3_debugmodel")
    assert st.num_params == 29_081_856  # the rank's experts (4 of 8) and all dense params
    for r in ranks:
        assert r["param_dtypes"] == ["torch.float32"]
        # Dense params over fsdp=2, experts over ep=2: half of 33,014,016 on each rank.
        assert r["num_params"] == 33_014_016 // 2
        one_unit = r["unsharded_peak_fwd_bytes"] // 2  # bf16 elements of one block
        assert st.param_bytes == r["param_bytes"] + 2 * 2 * one_unit
        # Gradients: the fp32 shard (measured after the step) and, in the model, one
        # block's unsharded bf16 gradient with its fp32 copy for the reduce-scatter.
        assert st.grad_bytes == r["grad_bytes"] + (2 + 4) * one_unit
        # AdamW: 8 bytes per sharded element, plus a 4-byte step per tensor (the model
        # counts megatron-core's tensor list: within 32 tensors of torchtitan's).
        assert st.optimizer_bytes - 4 * 32 <= r["optimizer_bytes"] + \
            r["optimizer_step_bytes"] <= st.optimizer_bytes
        assert r["optimizer_bytes"] == 8 * r["num_params"]
    print(f"activations per microbatch: model {st.activation_bytes_per_microbatch:,}, "
          f"measured {[r['activation_bytes'] for r in ranks]} (CPU math attention)")
