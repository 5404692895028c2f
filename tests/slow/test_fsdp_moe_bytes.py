"""The bytes FSDP moves per MoE layer and microbatch, against a real megatron-core model.

megatron-core 0.16.1's Megatron-FSDP (distributed/fsdp/src/megatron_fsdp/megatron_fsdp.py)
with ``data_parallel_sharding_strategy='optim_grads_params'`` all-gathers an FSDP unit's
parameters before its forward (``_pre_forward_param_unshard``), releases them after it
(``_post_forward`` -> ``release_module_parameters``; lazily inside a recompute forward,
so a recomputed layer is not gathered twice in backward), gathers them again before its
backward (``_pre_backward_param_unshard``) and reduce-scatters the gradients on every
backward (``grad_reduce_every_bprop`` for optim_grads_params): two all-gathers of the
parameters and one reduce-scatter of the gradients per layer and microbatch, expert
parameters included (over the expert-data-parallel group). The layer's parameters are
counted on a real megatron-core GPTModel (one CPU process, local spec, a dense and a MoE
layer with a shared expert); comm/layer_comm.fsdp_comms must move exactly those bytes.
"""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_BUILD = r"""
import json, re, sys
sys.path.insert(0, {root!r})
from primus_ext.frameworks.megatron.build import build, init_distributed, prepare_runtime
prepare_runtime(1)
init_distributed()
from primus_ext.frameworks.megatron.args import parse_launch_args
spec = parse_launch_args({argv!r}).spec
layers = {{}}
for name, p in build(spec, with_optimizer=False).bare().named_parameters():
    m = re.search(r"decoder\.layers\.(\d+)\.", name)
    if m:
        d = layers.setdefault(int(m.group(1)), [0, 0])
        d[1 if ".experts." in name else 0] += p.numel()
print(json.dumps(layers))
"""
MOE = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
       "--seq-length", "32", "--max-position-embeddings", "32", "--ffn-hidden-size", "128",
       "--num-experts", "4",
       "--moe-ffn-hidden-size", "32", "--moe-shared-expert-intermediate-size", "32",
       "--swiglu", "--normalization", "RMSNorm", "--disable-bias-linear",
       "--group-query-attention", "--num-query-groups", "2",
       "--untie-embeddings-and-output-weights", "--position-embedding-type", "rope",
       "--vocab-size", "256", "--tokenizer-type", "NullTokenizer", "--moe-layer-freq",
       "[0,1]", "--transformer-impl", "local", "--micro-batch-size", "1",
       "--global-batch-size", "8", "--target-hardware", "cpu", "--target-nodes", "1",
       "--target-gpus-per-node", "1"]


def test_fsdp_moves_each_layers_parameters_twice_and_its_gradients_once():
    from primus_ext.comm.layer_comm import fsdp_comms
    from primus_ext.comm.step_comm import grad_bytes_per_param
    from primus_ext.compute.rank_params import layer_params_on_rank
    from primus_ext.frameworks.megatron.args import parse_launch_args
    from primus_ext.presets import hardware_preset
    from primus_ext.spec import ClusterSpec

    code = _BUILD.format(root=str(ROOT), argv=MOE)
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    counted = {int(k): v for k, v in json.loads(res.stdout.strip().splitlines()[-1]).items()}
    spec = parse_launch_args(MOE).spec
    assert counted[1][1] > 0  # the MoE layer's experts are in the count
    # FSDP over 8 H100s (DP 8, EP 1: Megatron-LM forbids FSDP with EP > 1).
    fsdp = dataclasses.replace(
        spec, parallel=dataclasses.replace(spec.parallel, fsdp=True,
                                           use_distributed_optimizer=False),
        cluster=ClusterSpec(hardware=hardware_preset("h100"), num_nodes=1))
    assert fsdp.dp == 8
    pb, gb = fsdp.train.param_bytes, grad_bytes_per_param(fsdp)
    for layer, (dense, expert) in counted.items():
        assert layer_params_on_rank(spec.model, spec.parallel, layer) == (dense, expert)
        ops = [c for c, _ in fsdp_comms(fsdp, dense, expert, 1e-3, 1e-3, f"l{layer}")]
        gathered = sum(c.num_bytes for c in ops if c.collective == "all_gather")
        reduced = sum(c.num_bytes for c in ops if c.collective == "reduce_scatter")
        assert gathered == 2 * (dense + expert) * pb
        assert reduced == (dense + expert) * gb
        # The experts travel over the expert-data-parallel group, the rest over DP.
        assert sum(c.num_bytes for c in ops if c.axis == "edp") == expert * (2 * pb + gb)
