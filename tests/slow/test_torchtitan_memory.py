"""What real torchtitan models allocate and save on this CPU (``scripts/memory_torchtitan.py``,
FSDP2 over 2 processes, TP 2, PP 2), checked against the model's own parameter count and
torchtitan's documented layout, and the comparison with a memory function run end to end.

The facts asserted are torchtitan's (``torchtitan/distributed/fsdp.py``: fp32 master
parameters sharded by FSDP2, mixed precision bf16 for compute, fp32 gradient reduction;
AdamW with two fp32 moments), counted on real tensors.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("torchtitan")

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def result(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("mem") / "mem.json"
    res = subprocess.run([sys.executable, str(ROOT / "scripts" / "memory_torchtitan.py"),
                          "--json", str(out)], cwd=ROOT, capture_output=True, text=True,
                         timeout=1200)
    assert res.returncode == 0, res.stderr[-4000:]
    return json.loads(out.read_text())


def _dims() -> dict:
    sys.path.insert(0, str(ROOT / "scripts"))
    import memory_torchtitan as m
    return m.DIMS


def _total_params() -> int:
    d = _dims()
    h, f, v = d["hidden_size"], d["ffn_hidden_size"], d["vocab_size"]
    kv = h // d["num_attention_heads"] * d["num_query_groups"]
    block = h * (h + 2 * kv) + h * h + 3 * h * f + 2 * h  # wqkv, wo, w1/w2/w3, 2 norms
    return d["num_layers"] * block + 2 * v * h + h  # embeddings, lm_head, final norm


def test_states_are_the_whole_model_in_fp32(result):
    d = _dims()
    total = _total_params()
    # TP replicates the norms' weights (two per block, the final one) on both ranks.
    replicated = {"tp2": (2 * d["num_layers"] + 1) * d["hidden_size"]}
    for case, ranks in result["raw"].items():
        # Every parameter once over the 2 ranks (sharded, split or staged), in fp32.
        assert sum(r["num_params"] for r in ranks) == total + replicated.get(case, 0), case
        for r in ranks:
            assert r["param_dtypes"] == ["torch.float32"], case
            assert r["param_bytes"] == 4 * r["num_params"], case
            assert r["grad_bytes"] == r["param_bytes"], case  # fp32 gradient shards
            assert r["optimizer_bytes"] == 2 * r["param_bytes"], case  # AdamW moments


def test_activations_follow_the_layout(result):
    raw = result["raw"]
    per_layer = {case: {k: v for k, v in ranks[0]["activation_by_scope"].items()
                        if k.startswith("layer.")} for case, ranks in raw.items()}
    fsdp = set(per_layer["fsdp2"].values())
    assert len(fsdp) == 1, per_layer["fsdp2"]  # identical blocks save identical bytes
    (fsdp_layer,) = fsdp
    # PP 2 runs micro batch 1 against FSDP2's 2: half of every saved activation.
    assert set(per_layer["pp2"].values()) == {fsdp_layer // 2}
    # TP 2 splits heads and FFN; its saved bytes per block are fewer than unsplit.
    assert max(per_layer["tp2"].values()) < fsdp_layer
    # Under PP torchtitan keeps every FSDP2 group unsharded from forward to backward.
    assert all(r["unsharded_param_bytes"] > 0 for r in raw["pp2"])
    assert all(r["unsharded_param_bytes"] == 0 for r in raw["fsdp2"])


def test_comparison_rows_cover_every_rank_and_state(result):
    rows = result["rows"]
    for case, ranks in result["raw"].items():
        mine = [r for r in rows if r["case"] == case]
        assert len(mine) == 4 * len(ranks)
        for r in mine:
            assert r["diff_bytes"] == r["model_bytes"] - r["real_bytes"]
