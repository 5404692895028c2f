"""Unsynchronised host pauses made global by FSDP's collectives (project/host_pauses.py),
against llm-foundry's own large-scale table: every MPT model measured at 128, 256 and
512 H100s with the same per-GPU batch (github.com/mosaicml/llm-foundry@8c8dd48f72168
scripts/train/benchmarking/README.md, "H100 80GB BF16 (Large Scale, >= 128 GPUs)",
tokens/s/GPU). The public set holds the 512-GPU rows (and MPT-70B's 128): the 256-GPU
figures were never fitted."""
from __future__ import annotations

import csv
import os
import tempfile
from dataclasses import replace

import pytest

from primus_ext.project.calibration import load_calibration
from primus_ext.project.estimate import project
from primus_ext.project.host_pauses import host_pause_s, pause_group_size
from primus_ext.published import DEFAULT_PATH, read_runs

# model -> {GPUs: measured tokens/s/GPU}; run id of the model's 512-GPU row in the set.
MPT_TABLE = {
    "P081": ("MPT-1B", {128: 44123, 256: 42555, 512: 39837}),
    "P080": ("MPT-3B", {128: 23422, 256: 22772, 512: 21664}),
    "P079": ("MPT-7B", {128: 10475, 256: 10119, 512: 9670}),
    "P078": ("MPT-13B", {128: 5080, 256: 4989, 512: 4952}),
    "P077": ("MPT-30B", {128: 2199, 256: 2148, 512: 2115}),
    "P075": ("MPT-70B", {128: 1058, 256: 1035, 512: 1007}),
}


def _runs(gpus: int):
    """The six 512-GPU rows re-read at ``gpus`` GPUs (data parallel over all, the same
    microbatch: the table's weak scaling)."""
    with open(DEFAULT_PATH, newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["run_id"] in MPT_TABLE]
    out = []
    for r in rows:
        n = dict(r, num_gpus=str(gpus), dp=str(gpus), gbs=str(int(r["mbs"]) * gpus),
                 measured_tokens_per_s_per_gpu=str(MPT_TABLE[r["run_id"]][1][gpus]))
        out.append(n)
    fd, path = tempfile.mkstemp(suffix=".csv")
    os.close(fd)
    try:
        with open(path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(out)
        return {run.run_id: run for run in read_runs(path)}
    finally:
        os.unlink(path)


@pytest.fixture(scope="module")
def projected():
    calib = load_calibration("default")
    return {g: {rid: project(run.spec, calibration=calib).tokens_per_s_per_gpu
                for rid, run in _runs(g).items()} for g in (128, 256, 512)}


def test_the_fsdp_group_pays_its_members_pauses():
    run = _runs(512)["P081"]
    spec = load_calibration("default").apply(run.spec)
    assert pause_group_size(spec) == 512
    f = spec.cluster.hardware.host_pause_fraction
    assert host_pause_s(spec, 2.0) == pytest.approx(511 * f * 2.0)
    # Megatron-FSDP with two optimizer instances (HSDP): each shards over 256 ranks.
    hsdp = replace(spec, parallel=replace(spec.parallel,
                                          num_distributed_optimizer_instances=2))
    assert pause_group_size(hsdp) == 256
    # No FSDP (a distributed-optimizer run): nothing waits within the step.
    dist = replace(spec, parallel=replace(spec.parallel, fsdp=False,
                                          fsdp_reshard_after_forward=True,
                                          use_distributed_optimizer=True))
    assert pause_group_size(dist) == 1 and host_pause_s(dist, 2.0) == 0.0
    # No second clock (the CPU preset's device is its host): no pause is modelled.
    cpu = replace(spec, cluster=replace(spec.cluster, hardware=replace(
        spec.cluster.hardware, host_clock=False)))
    assert host_pause_s(cpu, 2.0) == 0.0


def test_mpt_weak_scaling_loss_follows_the_table(projected):
    # The table loses 2.5-9.7 % of tokens/s/GPU from 128 to 512 GPUs (6.0 % on average);
    # without the pauses the projection loses about 1 % (the collectives' own growth).
    measured, model = [], []
    for rid, (_, table) in MPT_TABLE.items():
        measured.append(table[512] / table[128])
        model.append(projected[512][rid] / projected[128][rid])
    gaps = [abs(a - b) for a, b in zip(measured, model)]
    assert sum(gaps) / len(gaps) < 0.03
    mean = sum(model) / len(model)
    assert 0.91 < mean < 0.97


def test_mpt_256_gpus_never_fitted(projected):
    # The 256-GPU column is outside the public set: each model within 8 %, and the
    # projected loss from 128 to 256 GPUs about half of 128 to 512 (linear in the group).
    for rid, (name, table) in MPT_TABLE.items():
        err = projected[256][rid] / table[256] - 1
        assert abs(err) < 0.08, (name, err)
        half = 1 - projected[256][rid] / projected[128][rid]
        full = 1 - projected[512][rid] / projected[128][rid]
        assert 0.25 < half / full < 0.5, (name, half, full)
