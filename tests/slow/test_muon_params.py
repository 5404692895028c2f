"""Which parameters Muon updates, against a real megatron-core GPTModel: megatron-core
0.16.1's get_megatron_muon_optimizer gives Muon every 2-D parameter that is not
``is_embedding_or_output_parameter`` and Adam the rest; memory/muon.py's split of a
rank's parameters must match the built model's (one CPU process, local spec)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_BUILD = r"""
import json, sys
sys.path.insert(0, {root!r})
from primus_ext.frameworks.megatron.build import build, init_distributed, prepare_runtime
prepare_runtime(1)
init_distributed()
from primus_ext.frameworks.megatron.args import parse_launch_args
spec = parse_launch_args({argv!r}).spec
built = build(spec, with_optimizer=False)
muon = adam = 0
for name, p in built.bare().named_parameters():
    if len(p.shape) == 2 and not getattr(p, "is_embedding_or_output_parameter", False):
        muon += p.numel()
    else:
        adam += p.numel()
print(json.dumps([muon, adam]))
"""
MOE = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
       "--seq-length", "32", "--max-position-embeddings", "32", "--ffn-hidden-size", "128",
       "--num-experts", "4",
       "--moe-ffn-hidden-size", "32", "--moe-shared-expert-intermediate-size", "32",
       "--swiglu", "--normalization", "RMSNorm", "--disable-bias-linear",
       "--group-query-attention", "--num-query-groups", "2",
       "--untie-embeddings-and-output-weights", "--position-embedding-type", "rope",
       "--vocab-size", "256", "--tokenizer-type", "NullTokenizer", "--moe-layer-freq",
       "[0,1]", "--transformer-impl", "local", "--optimizer", "muon",
       "--target-hardware", "cpu", "--target-nodes", "1", "--target-gpus-per-node", "1"]


def test_muon_split_matches_megatron_cores_model():
    from primus_ext.frameworks.megatron.args import parse_launch_args
    from primus_ext.memory.muon import muon_shard
    code = _BUILD.format(root=str(ROOT), argv=MOE)
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    muon, adam = json.loads(res.stdout.strip().splitlines()[-1])
    spec = parse_launch_args(MOE).spec
    sh = muon_shard(spec.model, spec.parallel, 0, local_spec=True)
    assert (sh.muon_dense + sh.muon_expert, sh.adam_dense + sh.adam_expert) == (muon, adam)
    assert muon > 0 and adam > 0
