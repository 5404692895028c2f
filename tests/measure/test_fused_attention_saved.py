"""The fused-attention save set of the TE memory model against real tensors: PyTorch's
CPU flash-attention kernel (primus_ext/groundtruth/fused_attention.py) saves q, k, v
(GQA unexpanded), the output and an fp32 log-sum-exp per query and head, and nothing
of size s x s: exactly the attention terms memory/te_layer.py counts for TE's
FusedAttnFunc."""
from __future__ import annotations

from dataclasses import replace

import pytest

from primus_ext.groundtruth.fused_attention import fused_attention_saved
from primus_ext.memory.activations import layer_items
from primus_ext.memory.options import MemoryOptions
from primus_ext.presets import hardware_preset
from primus_ext.spec import ClusterSpec, ModelSpec, ParallelSpec, RunSpec, TrainSpec


@pytest.mark.parametrize("heads,groups", [(8, 2), (4, 4)])
def test_fused_attention_saves_what_te_layer_counts(heads, groups):
    b, s, hd = 2, 256, 32
    got = fused_attention_saved(b, heads, groups, s, hd)
    assert got["node"].startswith("ScaledDotProductFlashAttention")
    model = ModelSpec(name="t", num_layers=1, hidden_size=heads * hd,
                      num_attention_heads=heads, num_query_groups=groups,
                      ffn_hidden_size=64, vocab_size=128)
    spec = RunSpec(model=model, parallel=ParallelSpec(),
                   train=TrainSpec(seq_length=s, micro_batch_size=b, global_batch_size=b,
                                   attention_backend="flash", te=True),
                   cluster=ClusterSpec(hardware=hardware_preset("h100"), num_nodes=1,
                                       gpus_per_node=1))
    items = dict(layer_items(model, spec.parallel, spec.train, False, MemoryOptions()))
    ours = {"q": items["q.rotated"], "k": items["k.rotated"], "v": items["v.contiguous"],
            "out": items["proj.input"], "lse": items["softmax_lse"]}
    assert got["bytes"] == ours
