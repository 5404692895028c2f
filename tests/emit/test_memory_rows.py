"""Per-stage memory rows: the allocated peak beside the device peak, terms named."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "memory"))

from memory_specs import LLAMA, run  # noqa: E402

from primus_ext.emit.memory_rows import other_split, stage_lines, stage_table  # noqa: E402
from primus_ext.memory.report import memory_report  # noqa: E402


def test_rows_add_up_to_the_allocated_and_device_peaks():
    rep = memory_report(run(LLAMA, pp=2, gbs=64))
    header, rows = stage_table(rep)
    assert header[6] == "allocated peak" and header[-1] == "device peak"
    for s, row in zip(rep.stages, rows):
        inside, outside = other_split(s)
        assert set(outside) == {"cuda_context", "nccl", "fragmentation"}
        assert s.param_bytes + s.grad_bytes + s.optimizer_bytes + s.activation_bytes \
            + sum(inside.values()) == s.allocated_peak_bytes
        assert s.allocated_peak_bytes + sum(outside.values()) == s.total_bytes
        assert float(row[6]) == round(s.allocated_peak_bytes / 2**30, 2)
    lines = stage_lines(rep)
    assert len(lines) == 2 and "max_memory_allocated" in lines[0]
    assert "cuda_context" in lines[0] and "cublas_workspaces" in lines[0]
