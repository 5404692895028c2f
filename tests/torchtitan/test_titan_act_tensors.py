"""The torchtitan activation model against the tensors a real torchtitan 0.3.0 block saves.

One ``Llama3TransformerBlock`` of torchtitan's own llama3 1B configuration (GQA: 32 heads,
8 KV groups; fused ``wqkv``; ComplexRoPE) runs a bf16 forward on this CPU (parameters cast
to bf16 as FSDP2's mixed precision does; buffers such as the RoPE cache stay as built), and
every storage autograd keeps is counted. The one CPU-only difference is named: torch 2.13's
CPU ``rms_norm`` is composite and saves its input cast to fp32 and the fp32 product (8 B
per element) where the fused GPU kernel saves the bf16 input (2 B); the rstd is the same.
Under selective checkpointing the CPU's SDPA kernel (``_scaled_dot_product_flash_attention_
for_cpu``) is not in torchtitan's save list while the GPU's flash kernel is, so on this CPU
SDPA's output and log-sum-exp are recomputed, not saved.
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchtitan")

import primus_ext  # noqa: E402
from primus_ext.memory.options import DEFAULT_OPTIONS  # noqa: E402
from primus_ext.memory.torchtitan_act import block_items, embedding_items  # noqa: E402

B, S = 2, 64


@pytest.fixture(scope="module")
def block():
    from patches.torchtitan_sdpa import apply
    apply()  # flex -> SDPA: FlexAttention has no CPU backward
    from torchtitan.models.llama3 import llama3_configs
    cfg = llama3_configs["1B"](attn_backend="flex")
    torch.manual_seed(0)
    blk = cfg.layers[0].build()
    for p in blk.parameters():
        p.data = p.data.to(torch.bfloat16)
    att = blk.attention
    dims = {"hidden_size": cfg.dim, "num_attention_heads": att.n_heads,
            "num_query_groups": att.n_kv_heads,
            "ffn_hidden_size": blk.feed_forward.w1.weight.shape[0]}
    return blk, dims


def _spec(dims: dict, *extra: str):
    return primus_ext.compose(
        ["framework=torchtitan", "model=tiny_dense", "model.num_layers=2",
         *(f"model.{k}={v}" for k, v in dims.items()), "model.vocab_size=512",
         f"train.seq_length={S}", f"train.micro_batch_size={B}",
         f"train.global_batch_size={B}", "cluster.hardware=cpu", "cluster.num_nodes=1",
         "cluster.gpus_per_node=1", *extra])


def _saved_bytes(fn, skip) -> dict[int, tuple]:
    """Storages autograd keeps while ``fn`` runs (parameters and ``skip`` left out)."""
    seen: dict[int, tuple] = {}

    def pack(t):
        st = t.untyped_storage()
        if st.data_ptr() not in skip:
            seen.setdefault(st.data_ptr(), (st.nbytes(), t.dtype, tuple(t.shape)))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return seen, out


def _inputs(dim: int):
    x = torch.randn(B, S, dim, dtype=torch.bfloat16, requires_grad=True)
    # torchtitan's text datasets yield per-document positions with every batch.
    pos = torch.arange(S).repeat(B, 1)
    return x, pos


def test_block_saves_what_the_model_counts(block):
    blk, dims = block
    x, pos = _inputs(dims["hidden_size"])
    skip = {p.untyped_storage().data_ptr() for p in blk.parameters()}
    seen, _ = _saved_bytes(lambda: blk(x, None, pos), skip)
    real = sum(v[0] for v in seen.values())
    spec = _spec(dims)
    items = block_items(spec.model, spec.parallel, spec.train, False, DEFAULT_OPTIONS)
    n, h = B * S, dims["hidden_size"]
    cpu_only = 2 * (8 - 2) * n * h  # two composite CPU RMSNorms (see the module doc)
    assert sum(items.values()) == real - cpu_only
    # The RoPE cache each block gathers by position: complex64, (b, s, 1, head_dim/2).
    rope = [v for v in seen.values() if v[1] == torch.complex64]
    assert [v[0] for v in rope] == [items["rope.cache"]]
    # No (b, s, (heads + 2 * groups) * head_dim) tensor: the fused wqkv output is not kept.
    hd = h // dims["num_attention_heads"]
    qkv = (dims["num_attention_heads"] + 2 * dims["num_query_groups"]) * hd
    assert not any(v[2][-1] == qkv for v in seen.values())
    assert "wqkv.output" not in items


def test_tp_embedding_saves_its_vocab_mask():
    """torchtitan's vocab-parallel Embedding (the path taken whenever it has a TP group),
    on a one-rank gloo group: the shifted int64 ids and the mask in the compute dtype."""
    import torch.distributed as dist
    from torchtitan.models.common.embedding import Embedding
    own = not dist.is_initialized()
    if own:
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:29581", rank=0,
                                world_size=1)
    try:
        emb = Embedding(Embedding.Config(num_embeddings=512, embedding_dim=64))
        emb.weight.data = emb.weight.data.to(torch.bfloat16)
        emb.tp_group = dist.new_group([0])
        ids = torch.randint(0, 512, (B, S))
        seen, _ = _saved_bytes(lambda: emb(ids), {emb.weight.untyped_storage().data_ptr(),
                                                  ids.untyped_storage().data_ptr()})
    finally:
        if own:
            dist.destroy_process_group()
    spec = _spec({"hidden_size": 64, "num_attention_heads": 4, "num_query_groups": 4,
                  "ffn_hidden_size": 128})
    from dataclasses import replace
    par2 = replace(spec.parallel, tp=2)  # the mask is counted whenever tp > 1
    assert sum(v[0] for v in seen.values()) == sum(embedding_items(par2, spec.train).values())
    assert sum(embedding_items(spec.parallel, spec.train).values()) == B * S * 8


def test_selective_ac_saves_what_the_model_counts(block, monkeypatch):
    """torchtitan's own SelectiveAC around the block: the outputs of the ops its policy
    marks MUST_SAVE in forward, recorded op by op."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils.checkpoint import CheckpointPolicy
    import torchtitan.distributed.activation_checkpoint as tac
    blk, dims = block
    ops: list = []  # [func, output bytes, policy decision] in forward order

    def recording(policy):
        def wrapped(ctx, func, *args, **kwargs):
            d = policy(ctx, func, *args, **kwargs)
            # torch 2.13 asks the policy after running the op: the op is the last one
            # the outer mode saw with this func and no decision yet.
            if not ctx.is_recompute:
                last = next(o for o in reversed(ops) if o[0] == func and len(o) == 2)
                last.append(d)
            return d
        return original(wrapped)

    class Outputs(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            flat = out if isinstance(out, (tuple, list)) else (out,)
            ops.append([func, sum(t.untyped_storage().nbytes() for t in flat
                                  if isinstance(t, torch.Tensor))])
            return out

    original = tac.create_selective_checkpoint_contexts
    monkeypatch.setattr(tac, "create_selective_checkpoint_contexts", recording)
    wrapped = tac.SelectiveAC(tac.SelectiveAC.Config())._wrap_block(blk)
    x, pos = _inputs(dims["hidden_size"])
    with Outputs():
        wrapped(x, None, pos)
    decided = [o for o in ops if len(o) == 3]
    saved = [o for o in decided if o[2] == CheckpointPolicy.MUST_SAVE]
    mms = [o for o in decided if o[0] == torch.ops.aten.mm.default]
    assert len(mms) == 5  # wqkv, wo, w1, w3, w2
    assert [o[2] == CheckpointPolicy.MUST_SAVE for o in mms] == [True, False, True, False,
                                                                  True]
    spec = _spec(dims, "train.activation_checkpoint=selective")
    items = block_items(spec.model, spec.parallel, spec.train, False, DEFAULT_OPTIONS)
    # The checkpoint's input is kept apart from the policy; the CPU SDPA is recomputed.
    cpu_only = -(items["sdpa.output"] + items["sdpa.lse"])
    assert sum(o[1] for o in saved) == sum(items.values()) - items["block.input"] + cpu_only
    ops = tac._get_default_save_ops()
    assert torch.ops.aten._scaled_dot_product_flash_attention.default in ops
    assert torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default not in ops


def test_selective_ac_reissues_sp_all_gathers_not_reduce_scatters():
    """torchtitan's save list holds the reduce-scatter (and all-to-all) outputs but no
    all-gather nor all-reduce: under SAC the recompute re-issues the SP all-gathers (and
    TP's all-reduces without SP); the simulate model re-issues exactly those."""
    import torchtitan.distributed.activation_checkpoint as tac
    from primus_ext.project.simulate_backend import SELECTIVE_MODULES
    ops = tac._get_default_save_ops()
    f = torch.ops._c10d_functional
    assert f.reduce_scatter_tensor.default in ops and f.all_to_all_single.default in ops
    assert f.all_gather_into_tensor.default not in ops and f.all_reduce.default not in ops
    sac = SELECTIVE_MODULES["torchtitan_sac"]
    assert {"comm:all_gather", "comm:all_reduce"} <= sac
    assert "comm:reduce_scatter" not in sac and "comm:all_to_all" not in sac
