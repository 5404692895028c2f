"""Per-rank parameter placement and sharding (memory/rank_params.py)."""
from __future__ import annotations

from dataclasses import replace

import pytest

from memory_specs import GPT, LLAMA, MOE, preset
from primus_ext.memory.params import count_params, mlp_groups
from primus_ext.memory.rank_params import chunk_param_tensors, stage_params
from primus_ext.spec import ParallelSpec, padded_vocab


def _total(model, par, local=False):
    return sum(stage_params(model, par, s, local).num_params for s in range(par.pp))


@pytest.mark.parametrize("model", [LLAMA, MOE, GPT])
@pytest.mark.parametrize("pp,vpp", [(1, 1), (2, 1), (4, 1), (2, 2), (4, 2)])
def test_pipeline_stages_hold_every_parameter_once(model, pp, vpp):
    assert _total(model, ParallelSpec(pp=pp, vpp=vpp)) == count_params(model).num_params


TIED = replace(GPT, untie_embeddings_and_output_weights=False)


def test_tied_embedding_copy_on_last_stage_when_pp_gt_1():
    par = ParallelSpec(pp=2)
    emb = padded_vocab(GPT.vocab_size, GPT.make_vocab_size_divisible_by, 1) * GPT.hidden_size
    assert _total(TIED, par) == count_params(TIED).num_params + emb
    last = chunk_param_tensors(TIED, par, 1, 0)
    assert last[-1].name == "output_layer.weight" and last[-1].shared_embedding
    first = chunk_param_tensors(TIED, par, 0, 0)
    assert first[0].name.endswith("word_embeddings.weight") and first[0].shared_embedding
    # pp = 1: one tensor serves both, no copy
    assert _total(TIED, ParallelSpec()) == count_params(TIED).num_params


def test_vocab_padded_for_tp_then_split():
    par = ParallelSpec(tp=8)
    first = chunk_param_tensors(LLAMA, par, 0, 0)
    v = padded_vocab(LLAMA.vocab_size, 128, 8)
    assert v == 32768 - 32768 % 1024 and v % (128 * 8) == 0
    assert first[0].numel == v * LLAMA.hidden_size // 8


def test_tp_splits_linears_not_norms():
    one = stage_params(LLAMA, ParallelSpec(), 0).num_params
    two = stage_params(LLAMA, ParallelSpec(tp=2), 0).num_params
    norms = (2 * LLAMA.num_layers + 1) * LLAMA.hidden_size
    # 32000 pads to the same vocab at tp 1 and 2 (a multiple of 256)
    assert padded_vocab(LLAMA.vocab_size, 128, 2) == padded_vocab(LLAMA.vocab_size, 128, 1)
    assert two == (one - norms) // 2 + norms


def test_experts_split_over_ep_and_expert_tp():
    base = stage_params(MOE, ParallelSpec(), 0)
    ep = stage_params(MOE, ParallelSpec(ep=4), 0)
    etp = stage_params(MOE, ParallelSpec(ep=2, etp=2, tp=2, sequence_parallel=True), 0)
    experts = sum(g.num_params for g in mlp_groups(MOE, 1)
                  if g.shard == "expert") * (MOE.num_layers - 1)
    assert base.num_expert_params == 0  # ep = 1: mcore reduces experts with the dense grads
    assert ep.num_expert_params == experts // 4
    assert etp.num_expert_params == experts // 4
    assert ep.num_params == base.num_params - experts + experts // 4


def test_mtp_on_last_stage_with_its_embedding():
    ds = preset("deepseek_v3")
    par = ParallelSpec(pp=4)
    last = chunk_param_tensors(ds, par, 3, 0)
    names = [t.name for t in last]
    assert any(n.startswith("mtp.layers.0.") for n in names)
    assert names[0].endswith("word_embeddings.weight") and last[0].shared_embedding
    assert not any(n.startswith("mtp.") for t in chunk_param_tensors(ds, par, 0, 0)
                   for n in [t.name])


def test_mla_down_projections_replicated_in_te_spec_split_in_local_spec():
    ds = preset("deepseek_v3")
    par = ParallelSpec(tp=2, pp=16, sequence_parallel=True)
    te = stage_params(ds, par, 1).num_params
    local = stage_params(ds, par, 1, local_spec=True).num_params
    h = ds.hidden_size
    down = h * ds.q_lora_rank + h * (ds.kv_lora_rank + ds.qk_pos_emb_head_dim)
    assert te - local == 4 * down // 2  # stage 1 holds 4 of the 61 layers
