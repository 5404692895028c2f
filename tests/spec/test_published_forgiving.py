"""The reader reads what a person would read: recompute labels by meaning, an empty
sequence length from the model's pre-training context, a row without a published layout
with the tuner's layout; a cell it cannot map is one error naming the column and the
accepted forms, and nothing else in the file is lost."""
from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest

from primus_ext.published import DEFAULT_PATH, parse_row, read_runs


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    with open(DEFAULT_PATH, newline="") as f:
        return list(csv.DictReader(f))


def _row(rows, run_id="P029", **changes) -> dict:
    row = dict(next(r for r in rows if r["run_id"] == run_id))
    row.update(changes)
    return row


# (cell, granularity, method, num_layers, modules or None when megatron-core's default)
LABELS = [
    ("full", "full", "uniform", 1, None),
    ("AC", "full", "uniform", 1, None),
    ("full, block, 5 layers", "full", "block", 5, None),
    ("full (2 layers)", "full", "block", 2, None),
    ("selective", "selective", None, None, ("core_attn",)),
    ("selective(per-op)", "selective", None, None, ("core_attn",)),
    ("selective (rmsnorm and mla up-projection recomputed)", "selective", None, None,
     ("mla_up_proj", "layernorm")),
    ("selective: core_attn, moe_act", "selective", None, None, ("moe_act", "core_attn")),
    ("no", None, None, None, ("core_attn",)),
    ("none", None, None, None, ("core_attn",)),
]


@pytest.mark.parametrize("cell,gran,method,layers,modules", LABELS)
def test_recompute_labels_read_by_meaning(rows, cell, gran, method, layers, modules):
    run = parse_row(_row(rows, recompute=cell))
    assert run.spec is not None, run.error
    t = run.spec.train
    assert t.recompute_granularity == gran
    if gran == "full":
        assert (t.recompute_method, t.recompute_num_layers) == (method, layers)
    if modules is not None and gran == "selective":
        assert t.recompute_modules == modules
    if cell not in ("full", "selective", "none"):
        assert any(cell in n and "read as" in n for n in run.notes), run.notes


def test_unmappable_recompute_is_one_error_naming_column_and_forms(tmp_path: Path, rows):
    header = list(rows[0])
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=header)
    writer.writeheader()
    bad = "partially, sometimes"
    writer.writerows([r if r["run_id"] != "P029" else {**r, "recompute": bad}
                      for r in rows])
    path = tmp_path / "runs.csv"
    path.write_text(buf.getvalue())
    runs = {r.run_id: r for r in read_runs(path)}
    err = runs["P029"].error
    assert runs["P029"].spec is None and "P029" in err and "'recompute'" in err
    for form in ("none", "full", "selective", "block", "mla_up_proj"):
        assert form in err, err
    assert len(runs) == len(rows)
    assert all(r.spec is not None for i, r in runs.items() if i not in ("P029",))


def test_empty_seq_len_takes_the_presets_training_context(rows):
    run = parse_row(_row(rows, seq_len=""))  # Llama-3-8B (Megatron-Bridge, 8192 stated)
    assert run.spec is not None, run.error
    assert run.spec.train.seq_length == 8192
    assert any("seq_len empty: 8192" in n and "2407.21783" in n for n in run.notes)


def test_empty_seq_len_without_a_known_context_names_the_column(rows):
    run = parse_row(_row(rows, "P046", seq_len=""))  # MegatronGPT-1.7B: no preset
    assert run.spec is None and "P046" in run.error and "'seq_len'" in run.error


def test_rows_without_a_layout_use_the_tuners_layout():
    runs = {r.run_id: r for r in read_runs(DEFAULT_PATH)}
    for run_id in ("P055", "P056"):
        run = runs[run_id]
        assert run.spec is not None, run.error
        assert run.spec.world_size == int(run.row["num_gpus"])
        assert run.spec.train.global_batch_size == int(run.row["gbs"])
        assert run.spec.parallel.use_distributed_optimizer  # as the row states
        assert any("the tuner's best layout" in n for n in run.notes), run.notes
