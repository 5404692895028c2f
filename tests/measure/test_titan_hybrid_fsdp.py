"""The hybrid projection of a torchtitan FSDP2 target charges FSDP2's per-block
collectives (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py: an all-gather in
forward, another in backward, a reduce-scatter of the gradients), exposed whole on a CPU
where they block the rank (no streams), hidden behind compute where the device has
streams."""
from __future__ import annotations

import dataclasses
import time

import primus_ext
from primus_ext.comm.layer_comm import fsdp_comms
from primus_ext.measure.neighbours import PassClock
from primus_ext.presets.overrides import apply_overrides, spec_overrides
from primus_ext.project.from_profile import layer_costs_from_profile, project_from_profile
from primus_ext.project.torchtitan import simulated_view

from tests.measure.test_from_profile import _fit, profile_for

TARGET = ["framework=torchtitan", "model=tiny_dense", "model.num_layers=4",
          "model.hidden_size=256", "model.num_attention_heads=4", "model.num_query_groups=2",
          "model.ffn_hidden_size=512", "model.vocab_size=512", "train.seq_length=256",
          "cluster.hardware=cpu", "cluster.num_nodes=1", "cluster.gpus_per_node=2",
          "parallel.dp_shard=2", "train.micro_batch_size=1", "train.global_batch_size=16"]
FITS = [_fit(c, 5e-4, 1.0) for c in ("all_gather", "reduce_scatter", "all_reduce")]


def _with_streams(spec, streams: bool):
    hw = dataclasses.replace(spec.cluster.hardware, collective_streams=streams)
    return dataclasses.replace(spec, cluster=dataclasses.replace(spec.cluster, hardware=hw))


def _profile(target):
    # As run_measurement records it: the downscaled run's FSDP2 degree is what its one
    # process leaves (torchtitan's -1).
    pre = ("parallel.dp_shard=-1",)
    prof = profile_for(apply_overrides(target, list(pre)), fits=FITS)
    return dataclasses.replace(prof, target_overrides=tuple(spec_overrides(target)),
                               downscale_overrides=pre + prof.downscale_overrides)


def test_fsdp2_collectives_are_charged_in_the_hybrid_projection():
    target = primus_ext.compose(TARGET)
    prof = _profile(target)
    dense = layer_costs_from_profile(prof, simulated_view(target)).kinds["dense"]
    names = sorted(c.name.split(".")[-1] for c in dense.comms)
    assert names == ["fsdp_all_gather_bwd_dp", "fsdp_all_gather_dp",
                     "fsdp_reduce_scatter_dp"]
    # The cpu preset has no streams: every FSDP2 collective is exposed whole.
    assert all(c.exposed_s == c.seconds > 0 for c in dense.comms)
    est = project_from_profile(prof, target)
    per_mb = sum(c.exposed_s for k in ("dense",) for c in dense.comms)
    assert est.breakdown["dp_comm_s"] >= 8 * 4 * per_mb * 0.99  # 8 microbatches, 4 blocks


def test_streams_hide_fsdp2_collectives_behind_compute():
    target = simulated_view(primus_ext.compose(TARGET))
    args = (1e6, 0.0, 1.0, 1.0, "dense")  # parameters, no experts, 1 s windows
    blocked = fsdp_comms(_with_streams(target, False), *args)
    hidden = fsdp_comms(_with_streams(target, True), *args)
    assert [c.seconds for c, _ in blocked] == [c.seconds for c, _ in hidden]
    assert all(c.exposed_s == c.seconds for c, _ in blocked)
    assert all(c.exposed_s < c.seconds for c, _ in hidden)


def test_a_pass_that_waits_is_counted_as_sliced():
    with PassClock() as idle:
        time.sleep(0.05)  # not running: as if the scheduler gave the core away
    with PassClock() as busy:
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 0.05:
            pass
    assert idle.sliced > 5.0
    assert busy.sliced >= 1.0
    assert busy.sliced < idle.sliced
