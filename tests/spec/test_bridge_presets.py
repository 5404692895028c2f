"""Rows of Megatron-Bridge releases without a hand-read entry take the preset that
release's scripts define (published/bridge_presets.py, data/validation/
bridge_moe_configs.json built by scripts/bridge_moe_configs.py).

The rows below are copied from Megatron-Bridge@067f987df03b
docs/performance-summary-archive.md (sections 26.04.01, 26.04 and 26.02 NeMo Container,
Pre-Training Performance); the check is that the presets read from each release's
scripts have the layout the release's table prints.
"""
from __future__ import annotations

import csv

import pytest

from primus_ext.published import DEFAULT_PATH, read_runs
from primus_ext.published.bridge_presets import _table

# (release, system, model row to copy, precision, note, GPUs, TP, PP, VP, EP, MBS, GBS,
#  tokens/s/GPU) as printed
TABLE_ROWS = [
    ("26.04.01", "GB200", "P129", "fp8", "precision MXFP8", 256, 1, 8, 3, 32, 1, 8192, 5680),
    ("26.04.01", "B200", "P122", "fp8", "precision MXFP8", 256, 1, 8, 2, 32, 1, 4096, 3328),
    ("26.04.01", "H100", "P125", "bf16", "", 64, 1, 4, "", 8, 1, 1280, 5824),
    ("26.04.01", "H100", "P127", "fp8", "precision 'FP8'", 16, 1, 1, "", 16, 1, 1024, 8960),
    ("26.04.01", "H100", "P128", "fp8", "precision 'FP8'", 256, 2, 8, 4, 32, 1, 8192, 1712),
    ("26.04", "B200", "P122", "fp8", "precision MXFP8", 256, 1, 16, "", 8, 1, 4096, 2815),
    ("26.02", "H100", "P127", "fp8", "precision 'FP8'", 16, 1, 2, 12, 8, 1, 512, 5113),
]


def _read(path, table_rows):
    with open(DEFAULT_PATH, newline="") as f:
        rows = list(csv.DictReader(f))
    by_id = {r["run_id"]: r for r in rows}
    out = []
    for i, (rel, gpu, like, prec, note, n, tp, pp, vp, ep, mbs, gbs, tps) in \
            enumerate(table_rows):
        r = dict(by_id[like])
        r.update(run_id=f"T{i:03d}", source=f"MegatronBridge-perf-{rel}", gpu=gpu,
                 num_gpus=n, precision=prec, tp=tp, pp=pp, vp=vp, cp=1, ep=ep, etp="",
                 dp=n // (tp * pp), mbs=mbs, gbs=gbs, fsdp_or_zero="",
                 measured_tokens_per_s_per_gpu=tps, measured_tflops_per_gpu="",
                 notes=f"{note}; MoE force-balanced and token-dropless (the page's footnote)")
        out.append(r)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(out)
    return read_runs(path)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return _read(tmp_path_factory.mktemp("bridge") / "rows.csv", TABLE_ROWS)


def test_each_release_is_read_at_the_commit_that_published_its_table():
    releases = _table()["releases"]
    assert {"25.11", "26.02", "26.04", "26.04.01", "26.06"} <= set(releases)
    for rel in releases.values():
        assert len(rel["commit"]) == 40 and rel["presets"]


def test_the_tables_layouts_are_those_of_their_release_presets(runs):
    releases = _table()["releases"]
    for run, (rel, *_rest) in zip(runs, TABLE_ROWS):
        if rel == "26.02":
            continue
        commit = releases[rel]["commit"][:9]
        notes = " ".join(run.notes)
        assert commit in notes, run.run_id
        assert "the one with the table's layout" not in notes, run.run_id
        assert "that config's layout" not in notes, run.run_id


def test_a_row_reads_its_release_preset_and_pretrain_function(runs):
    by = {r.run_id: r for r in runs}
    # 26.04.01 H100 Qwen3-30B FP8: QWEN3_30B_A3B_PRETRAIN_CONFIG_H100_FP8_CS_V1, HybridEP.
    s = by["T003"].spec
    assert (s.parallel.moe_token_dispatcher_type, s.parallel.moe_flex_dispatcher_backend) \
        == ("flex", "hybridep")
    assert s.train.moe_router_force_load_balancing and s.parallel.moe_router_fusion
    assert any("17a381f95" in n for n in by["T003"].notes)
    # 26.04.01 H100 Qwen3-235B: the pretrain function sets the all-to-all dispatcher and
    # CommOverlapConfig(tp_comm_overlap=False); the preset the EP A2A overlap.
    s = by["T004"].spec
    assert s.parallel.moe_token_dispatcher_type == "alltoall"
    assert s.parallel.tp_comm_overlap is False
    assert s.parallel.overlap_moe_expert_parallel_comm
    # 26.04.01 B200 DeepSeek-V3 MXFP8 V2 (PP 8, VP 2, EP 32): DeepEP with the A2A
    # overlap, TE graphs of attn / router / preprocess, mla_up_proj and mlp recompute.
    s = by["T001"].spec
    assert s.parallel.moe_flex_dispatcher_backend == "deepep"
    assert s.parallel.overlap_moe_expert_parallel_comm
    assert s.train.cuda_graph_scope == ("attn", "moe_router", "moe_preprocess")
    assert s.train.recompute_modules == ("mla_up_proj", "mlp")


def test_a_layout_no_preset_of_the_release_has_takes_the_nearest_release_with_it(runs):
    # The 26.02 table prints Qwen3-30B on H100 at PP 2, VP 12, EP 8; the 26.02 scripts'
    # preset is PP 1, EP 16; 25.11's preset has the printed layout (all-to-all, A2A
    # overlap).
    run = [r for r in runs if r.run_id == "T006"][0]
    assert any("release 25.11's preset" in n for n in run.notes)
    s = run.spec
    assert s.parallel.moe_token_dispatcher_type == "alltoall"
    assert s.parallel.overlap_moe_expert_parallel_comm


def test_deepseek_v3_at_32_virtual_stages_takes_the_32_chunk_layout(tmp_path):
    # 25.11 table, DGX-GB200, DeepSeekV3 (w/o MTP) FP8-MX: PP 8, VP 4, EP 32. Megatron-LM's
    # DeepSeek-V3 GB200 guide runs this layout with --pipeline-model-parallel-layout
    # Et|(tt|)*30L: the first chunk the embedding and one layer, the last the loss.
    run = _read(tmp_path / "rows.csv", [("25.11", "GB200", "P117", "fp8", "precision MXFP8",
                                         256, 1, 8, 4, 32, 1, 4096, 4018)])[0]
    assert run.spec.parallel.pipeline_layout == (1,) + (2,) * 30 + (0,)
