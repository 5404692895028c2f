"""The NeMo 24.07 performance table's rows read NeMo 1's launcher recipes
(published/nemo_launcher.py): the table agrees with the yaml lines captured from
NeMo-Framework-Launcher tag 24.07 (tests/data/nemo_launcher_2407/), every row takes
Apex's distributed Adam, and Nemotron-4 340B, which ran on 80 GB H100s, fits."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from primus_ext.memory.report import memory_report
from primus_ext.published import read_runs
from primus_ext.published.nemo_launcher import NEMO_LAUNCHER_2407

DATA = Path(__file__).parent.parent / "data" / "nemo_launcher_2407" / \
    "training_yaml_lines.json"


def _value(entry: dict | None) -> str | None:
    if entry is None:
        return None
    v = entry["text"].split(":", 1)[1].split("#", 1)[0].strip()
    return None if v in ("null", "") else v


def test_table_agrees_with_the_launcher_yamls():
    files = json.loads(DATA.read_text())["files"]
    assert sorted(files) == sorted(e.path for e in NEMO_LAUNCHER_2407.values())
    for entry in NEMO_LAUNCHER_2407.values():
        lines = files[entry.path]
        assert _value(lines["optim.name"]) == "distributed_fused_adam", entry.path
        assert (_value(lines.get("optim.dtype")) or "fp32") == entry.optim_dtype, entry.path
        granularity = _value(lines.get("activations_checkpoint_granularity"))
        layers = _value(lines.get("activations_checkpoint_num_layers"))
        # block with 0 layers recomputes nothing
        assert granularity == entry.recompute_granularity, entry.path
        assert granularity is not None or layers in (None, "0"), entry.path


@pytest.fixture(scope="module")
def rows():
    return [r for r in read_runs() if r.source.startswith("NeMo-perf-summary-24.07")]


def test_every_row_takes_apex_distributed_adam(rows):
    assert len(rows) == 12
    for r in rows:
        assert r.spec.train.optimizer_impl == "apex_distributed_fused_adam", r.run_id
        assert any("distributed_fused_adam" in n for n in r.notes), r.run_id


def test_nemotron4_340b_reads_its_yaml_and_fits(rows):
    r = next(r for r in rows if r.model_preset == "nemotron4_340b")
    t = r.spec.train
    assert (t.exp_avg_dtype, t.exp_avg_sq_dtype) == ("bf16", "bf16")
    assert (t.recompute_granularity, t.recompute_modules) == ("selective", ("core_attn",))
    # The run ran on 80 GB H100s with the recipe's own (attention-only) recompute.
    rep = memory_report(r.spec)
    assert rep.fits, rep.peak_bytes / 2**30
    assert not any("does not fit" in n for n in r.notes), r.notes
