"""Per-stage memory as a user holds it against a log: the allocated peak (what
``torch.cuda.max_memory_allocated`` and Megatron-LM's ``mem-max-allocated-bytes`` report)
beside the device peak, and the named non-model terms of each (``memory/overhead.py``).
Shared by ``mode=memory`` and the tuner's report."""
from __future__ import annotations

from primus_ext.memory.overhead import DEVICE_TERMS

GIB = 2**30


def other_split(stage) -> tuple[dict[str, int], dict[str, int]]:
    """(terms inside PyTorch's allocator, terms outside it) of a StageMemory."""
    other = dict(stage.other)
    inside = {k: v for k, v in other.items() if k not in DEVICE_TERMS}
    outside = {k: v for k, v in other.items() if k in DEVICE_TERMS}
    return inside, outside


def _terms(terms: dict[str, int]) -> str:
    shown = [f"{k} {v / GIB:.2f}" for k, v in terms.items() if v]
    return ", ".join(shown) if shown else "none"


def stage_lines(report) -> list[str]:
    """One line per stage: allocated peak = model + allocated terms; device peak =
    allocated + the terms outside the allocator (GiB)."""
    out = []
    for s in report.stages:
        inside, outside = other_split(s)
        out.append(f"stage {s.stage}: allocated peak {s.allocated_peak_bytes / GIB:.2f} GiB "
                   f"(torch.cuda.max_memory_allocated; incl. {_terms(inside)}), device peak "
                   f"{s.total_bytes / GIB:.2f} GiB (+ {_terms(outside)})")
    return out


def stage_table(report) -> tuple[list[str], list[list]]:
    """Markdown-able rows: stage, weights, grads, optimizer, activations, allocated
    terms, allocated peak, outside-allocator terms, device peak (GiB)."""
    header = ["stage", "weights", "grads", "optimizer", "activations", "workspaces etc.",
              "allocated peak", "context + NCCL + fragmentation", "device peak"]
    rows = []
    for s in report.stages:
        inside, outside = other_split(s)
        rows.append([str(s.stage)] + [f"{v / GIB:.2f}" for v in (
            s.param_bytes, s.grad_bytes, s.optimizer_bytes, s.activation_bytes,
            sum(inside.values()), s.allocated_peak_bytes, sum(outside.values()),
            s.total_bytes)])
    return header, rows
