"""The aligned gradient-sync launch (project/dp_sync.aligned_launch_s) against
megatron-core's own interleaved schedule.

megatron-core 0.16.1 ``schedules.get_schedule_table`` and ``get_pp_rank_microbatches``
give each pipeline rank's order of forward and backward steps; the steps are played out
with their pipeline dependencies (a forward waits for the previous stage's, a backward
for the next stage's) and fixed step times, and each chunk's gradient sync is launched
by the rule of ``forward_backward_pipelining_with_interleaving`` with
``config.grad_sync_func`` set (``backward_step_helper_postprocess``: after the backward
of virtual microbatch ``k``, the chunk whose last microbatch is ``k - pipeline_rank``;
the rest once the loop ends)."""
from __future__ import annotations

import functools
from dataclasses import replace
from types import SimpleNamespace

import pytest

from primus_ext.presets import hardware_preset
from primus_ext.project import dp_sync as D
from primus_ext.spec import ClusterSpec, ModelSpec, ParallelSpec, RunSpec, TrainSpec

schedules = pytest.importorskip("megatron.core.pipeline_parallel.schedules")


def _launches(pp: int, vpp: int, nmb: int, tf: float, tb: float) -> list[dict[int, float]]:
    """Per rank: chunk -> launch time of its gradient sync, on the rank's clock (0 = its
    last backward ends)."""
    mb_of, chunk_of = zip(*schedules.get_schedule_table(nmb, vpp, pp))
    total = nmb * vpp
    ops = []
    for r in range(pp):
        comm = SimpleNamespace(pp_group=SimpleNamespace(size=lambda: pp, rank=lambda r=r: r),
                               virtual_pipeline_model_parallel_size=vpp)
        _, _, warm, rest = schedules.get_pp_rank_microbatches(nmb, vpp, pp,
                                                              p2p_communicator=comm)
        seq = [("F", k) for k in range(warm)]
        for k in range(rest):
            seq += [("F", warm + k), ("B", k)]
        seq += [("B", k) for k in range(rest, total)]
        ops.append([(kind, mb_of[k], chunk_of[k] if kind == "F" else vpp - 1 - chunk_of[k], k)
                    for kind, k in seq])
    index = {(r, o[0], o[1], o[2]): i for r in range(pp) for i, o in enumerate(ops[r])}

    @functools.lru_cache(None)
    def end(r: int, i: int) -> float:
        if i < 0:
            return 0.0
        kind, mb, c, _ = ops[r][i]
        if kind == "F":
            dep = (end(r - 1, index[(r - 1, "F", mb, c)]) if r > 0 else
                   end(pp - 1, index[(pp - 1, "F", mb, c - 1)]) if c > 0 else 0.0)
        else:
            dep = (end(r + 1, index[(r + 1, "B", mb, c)]) if r < pp - 1 else
                   end(0, index[(0, "B", mb, c + 1)]) if c < vpp - 1 else
                   end(r, index[(r, "F", mb, c)]))
        return max(end(r, i - 1), dep) + (tf if kind == "F" else tb)

    out = []
    for r in range(pp):
        last = end(r, len(ops[r]) - 1)
        got = {}
        for i, (kind, _, _, k) in enumerate(ops[r]):
            j = k - r  # grad_sync_virtual_microbatch_id
            if kind == "B" and j >= 0 and mb_of[j] == nmb - 1:
                got[vpp - 1 - chunk_of[j]] = end(r, i) - last
        out.append({c: got.get(c, 0.0) for c in range(vpp)})  # leftovers: at the end
    return out


@pytest.mark.parametrize("pp,vpp,nmb", [(2, 2, 4), (4, 2, 8), (4, 3, 8), (4, 2, 16),
                                        (8, 4, 16)])
def test_aligned_launch_is_megatron_cores_schedule(pp, vpp, nmb):
    tf, tb = 1.0, 2.0
    for r, got in enumerate(_launches(pp, vpp, nmb, tf, tb)):
        # dp_sync's clock: chunk c's last backward ends group * (bwd of chunks < c) before
        # the stage's end; the slack of stage r is the cool-down of the r stages before.
        model = {c: D.aligned_launch_s(-pp * tb * c, r * tb) for c in range(vpp)}
        assert got == pytest.approx(model), (pp, vpp, nmb, r)


def _spec():
    hw = replace(hardware_preset("h100"), comm_overlap_penalty=0.0)
    model = ModelSpec(name="llama8b", num_layers=32, hidden_size=4096,
                      num_attention_heads=32, num_query_groups=8, ffn_hidden_size=14336,
                      vocab_size=128256)
    return RunSpec(model=model, parallel=ParallelSpec(tp=8, pp=4, vpp=2),
                   train=TrainSpec(seq_length=4096, global_batch_size=256),
                   cluster=ClusterSpec(hardware=hw, num_nodes=4))


def test_aligned_sync_leaves_stage0_chunk0_exposed():
    # Stage 0: chunk 0 in 4 buckets of 0.1 s, chunk 1 one bucket of 0.3 s; backward of
    # one microbatch 0.2 s per chunk, 4 microbatches per group.
    buckets = [[(0.25, 0.1), (0.5, 0.1), (0.75, 0.1), (1.0, 0.1)], [(1.0, 0.3)]]
    bwd = [0.2, 0.2]
    s = _spec()
    hooks = D.grad_sync_exposed_s(s, buckets, bwd, 4)
    aligned = D.grad_sync_exposed_s(s, buckets, bwd, 4, aligned=True)
    # Bucket by bucket, chunk 0's buckets start during its last backward (ready at
    # -0.15 s, the stream free at -0.05 s: 0.25 s left at the end); aligned, all of
    # chunk 0 goes out after the final backward (chunk 1's 0.3 s is done by then).
    assert hooks == pytest.approx(0.25)
    assert aligned == pytest.approx(0.4)
    # A later stage launches when stage 0 finishes each chunk, so the slack of its
    # cool-down no longer runs its chunks early, but still hides chunk 0's tail.
    assert D.grad_sync_exposed_s(s, buckets, bwd, 4, slack_s=0.3, aligned=True) == (
        pytest.approx(0.1))


def test_spec_and_drop_in_default_to_megatron_lms_alignment():
    from primus_ext.frameworks.megatron.args import parse_launch_args
    from primus_ext.frameworks.megatron.flags import megatron_argv
    assert _spec().parallel.align_grad_reduce
    flat = ["--num-layers", "8", "--hidden-size", "256", "--num-attention-heads", "4",
            "--seq-length", "512", "--max-position-embeddings", "512",
            "--micro-batch-size", "1", "--global-batch-size", "64",
            "--tensor-model-parallel-size", "1", "--pipeline-model-parallel-size", "2",
            "--use-distributed-optimizer", "--overlap-grad-reduce",
            "--overlap-param-gather", "--bf16",
            "--target-nodes", "1", "--target-hardware", "h100"]
    base = flat + ["--num-layers-per-virtual-pipeline-stage", "2"]
    par = parse_launch_args(base).spec.parallel
    assert par.vpp == 2 and par.align_grad_reduce and par.align_param_gather
    off = parse_launch_args(base + ["--no-align-grad-reduce", "--no-align-param-gather"])
    assert not off.spec.parallel.align_grad_reduce
    assert not off.spec.parallel.align_param_gather
    assert "--no-align-grad-reduce" in megatron_argv(off.spec)
    assert "--no-align-param-gather" in megatron_argv(off.spec)
    # Without virtual stages Megatron-LM turns the aligned gather off (arguments.py).
    assert not parse_launch_args(flat).spec.parallel.align_param_gather
