"""mode=memory: per-stage memory of one RunSpec, with a fits verdict."""
from __future__ import annotations

from primus_ext.config import layout_note, spec_and_notes
from primus_ext.emit.console import gib, print_json, print_table
from primus_ext.emit.memory_rows import stage_lines
from primus_ext.memory.fit_ladder import cheapest_fit
from primus_ext.memory.report import memory_report


def run(cfg) -> dict:
    spec, unstated = spec_and_notes(cfg)
    report = memory_report(spec)
    out = report.to_dict()
    out["notes"] = list(report.notes)
    if not report.fits:
        # The cheapest recompute that makes it fit (memory/fit_ladder.py), as a hint.
        out["suggestion"] = cheapest_fit(spec).note
    where = layout_note(cfg)
    if where:
        out["layout_note"] = where
    if unstated:
        out["unstated"] = unstated
    if cfg.get("plot"):
        from primus_ext.emit.plots import plot_memory
        plot_memory(spec, report, cfg.plot)
    if cfg.output == "json":
        print_json(out)
        return out
    rows = [(s.stage, s.num_params, gib(s.param_bytes), gib(s.grad_bytes),
             gib(s.optimizer_bytes), gib(s.activation_bytes_per_microbatch),
             s.num_inflight_microbatches, gib(s.activation_bytes), gib(s.other_bytes),
             gib(s.allocated_peak_bytes), gib(s.total_bytes)) for s in report.stages]
    print_table(f"{spec.model.name}: memory per GPU by pipeline stage (GiB)",
                ["stage", "params", "weights", "grads", "optimizer", "act/mb",
                 "in-flight mb", "activations", "other", "allocated", "device"], rows,
                caption=f"peak {gib(report.peak_bytes):.2f} GiB of "
                        f"{gib(report.device_bytes):.2f} GiB: "
                        f"{'fits' if report.fits else 'DOES NOT FIT'}; allocated = what "
                        "torch.cuda.max_memory_allocated (Megatron-LM's "
                        "mem-max-allocated-bytes) reports, device = allocated + CUDA "
                        "context, NCCL buffers, fragmentation")
    for line in stage_lines(report):
        print(f"  {line}")
    for note in out["notes"]:
        print(f"note: {note}")
    if out.get("suggestion"):
        print(f"note: {out['suggestion']}")
    if where:
        print(f"note: {where}")
    for note in unstated:
        print(f"note: {note}")
    return out
