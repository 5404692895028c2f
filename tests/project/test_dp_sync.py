"""Data-parallel sync timing (project/dp_sync.py): which chunks are bucketed, the aligned
parameter gather, the pipeline cool-down / warm-up slack, and the recipes that set them."""
from __future__ import annotations

from dataclasses import replace

import pytest

from primus_ext.comm.step_comm import dp_grad_sync, param_gather
from primus_ext.memory.grad_buffer import chunk_buffers
from primus_ext.presets import hardware_preset
from primus_ext.project import dp_sync as D
from primus_ext.published import DEFAULT_PATH, read_runs
from primus_ext.spec import ClusterSpec, ModelSpec, ParallelSpec, RunSpec, TrainSpec

LLAMA = ModelSpec(name="llama8b", num_layers=32, hidden_size=4096, num_attention_heads=32,
                  num_query_groups=8, ffn_hidden_size=14336, vocab_size=128256)


def spec(nodes=4, **par) -> RunSpec:
    return RunSpec(model=LLAMA, parallel=ParallelSpec(**par),
                   train=TrainSpec(seq_length=4096, global_batch_size=256),
                   cluster=ClusterSpec(hardware=hardware_preset("h100"), num_nodes=nodes))


def test_bucket_layout_is_megatron_cores():
    # memory/grad_buffer.chunk_buffers is checked byte for byte against megatron-core's DDP
    # buffers (tests/slow/test_memory_vs_megatron.py, a PP=2 VP=2 case among them): only
    # chunk 0 of stage 0 is cut into buckets (DistributedDataParallel.__init__:
    # bucket_size=None when pp_rank > 0 or disable_bucketing; Megatron-LM / NeMo pass
    # disable_bucketing=(model_chunk_idx > 0)). The timing sees the same split.
    s = spec(tp=2, pp=2, vpp=2, ddp_bucket_params=60_000_000)
    par = s.parallel
    for stage, (chunks, _) in enumerate(D._param_counts(s)):
        syncs = D._chunk_syncs(s, chunks, dp_grad_sync, stage == 0, stage=stage)
        gathers = D._chunk_syncs(s, chunks, param_gather, stage == 0, stage=stage)
        for c, (buckets, gb) in enumerate(zip(syncs, gathers)):
            layout = chunk_buffers(s.model, par, stage, c, s.dp, s.expert_dp).dense
            assert len(buckets) == len(gb) == len(layout.buckets)
            if stage > 0 or c > 0:
                assert len(layout.buckets) == 1
                continue
            # megatron closes a bucket once it holds >= bucket_size elements of whole
            # parameters: fewer, larger buckets than an even split (9, not 19, here).
            assert 2 < len(layout.buckets) < 1.135e9 / 60e6
            sizes = [b.end - b.start for b in layout.buckets]
            # Reduce-scatters in buffer order (the backward fills bucket 0 first), gathers
            # in forward order; each bucket's time grows with its size.
            t_grad = [t for _, t in buckets]
            t_gather = [t for _, t in gb]
            assert sorted(range(len(sizes)), key=sizes.__getitem__) == sorted(
                range(len(t_grad)), key=t_grad.__getitem__)
            rev = sizes[::-1]
            assert sorted(range(len(rev)), key=rev.__getitem__) == sorted(
                range(len(t_gather)), key=t_gather.__getitem__)


def test_torchtitan_view_keeps_buckets_everywhere():
    s = spec(tp=2, pp=2, vpp=2)
    chunks = D._param_counts(s)[1][0]
    syncs = D._chunk_syncs(s, chunks, dp_grad_sync, False, all_bucketed=True, stage=1)
    assert all(len(b) > 1 for b in syncs)


def test_bucket_size_field_sets_the_bucket_count():
    n = 1.0e9
    default = dp_grad_sync(spec(tp=8), n).num_buckets  # max(40M, 1M * dp=4) = 40M
    nemo = dp_grad_sync(spec(tp=8, ddp_bucket_params=128 * 1024 * 1024), n).num_buckets
    assert (default, nemo) == (25, 8)
    assert param_gather(spec(tp=8), n, bucketed=False).num_buckets == 1
    with pytest.raises(ValueError, match="ddp_bucket_params"):
        ParallelSpec(ddp_bucket_params=0)


def _one_bucket_chunks(seconds, n):
    return [[(1.0, seconds)] for _ in range(n)]


def test_aligned_gather_dispatches_whole_chunks_ahead():
    # Two buckets per chunk, 3 chunks, 1 s per bucket, forward 0.1 s per chunk, 2
    # microbatches per group. Chain (pre-hook): the next bucket starts when the previous
    # one is needed. Aligned (megatron-core schedules.py param_sync_func): chunks 0 and 1
    # at t=0, chunk 2 when chunk 1's first forward is launched; the stream never idles.
    s = spec(tp=8, pp=2, vpp=4)
    hw0 = replace(s.cluster.hardware, comm_overlap_penalty=0.0)
    s = replace(s, cluster=replace(s.cluster, hardware=hw0))
    buckets = [[(0.5, 1.0), (1.0, 1.0)] for _ in range(3)]
    fwd = [0.1, 0.1, 0.1]
    chain = D.param_gather_exposed_s(s, buckets, fwd, 2)
    aligned = D.param_gather_exposed_s(
        replace(s, parallel=replace(s.parallel, align_param_gather=True)), buckets, fwd, 2)
    # Aligned: 6 s of gathers back to back; the last bucket is needed 0.45 s of forward
    # progress in (chunk 2 starts after 2 groups of 2 x 0.1 s, its second half at +0.05).
    assert aligned == pytest.approx(6.0 - 0.45)
    assert chain >= aligned
    # With the warm-up lead of a later stage the aligned gathers start that much earlier.
    lead = D.param_gather_exposed_s(
        replace(s, parallel=replace(s.parallel, align_param_gather=True)), buckets, fwd, 2,
        lead_s=0.3)
    assert lead == pytest.approx(6.0 - 0.45 - 0.3)


def test_cool_down_slack_hides_a_later_stage_gradient_sync():
    s = spec(tp=8, pp=2)
    hw = s.cluster.hardware
    buckets = _one_bucket_chunks(0.5, 1)
    bare = D.grad_sync_exposed_s(s, buckets, [0.2], 1)
    assert bare == pytest.approx(0.5)  # one bucket: issued when the backward ends
    hidden = D.grad_sync_exposed_s(s, buckets, [0.2], 1, slack_s=0.3)
    assert hidden == pytest.approx(0.2 + hw.comm_overlap_penalty * 0.3)
    assert D.grad_sync_exposed_s(s, buckets, [0.2], 1, slack_s=1.0) == pytest.approx(
        hw.comm_overlap_penalty * 0.5)


def test_recipes_set_the_dp_overlap_of_their_stacks():
    runs = {r.run_id: r for r in read_runs(DEFAULT_PATH)}
    nemo2 = runs["P018"].spec.parallel  # NeMo 25.02, TP8 PP4 VP12 DP4
    assert nemo2.align_param_gather and nemo2.ddp_bucket_params == 128 * 1024 * 1024
    readme = runs["P049"].spec.parallel  # Megatron-LM core_r0.8.0: no such settings
    assert not readme.align_param_gather and readme.ddp_bucket_params is None
    nemo1 = runs["P010"].spec.parallel  # NeMo 24.07 (NeMo 1.x): chained gathers
    assert not nemo1.align_param_gather
