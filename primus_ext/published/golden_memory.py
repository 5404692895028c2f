"""The memory model's allocated peak against Megatron-LM's own GPU logs (pure).

Every Megatron-LM functional-test case of ``tests/data/megatron_golden/h100.json`` with
a ``mem-max-allocated-bytes`` series (``torch.cuda.max_memory_allocated`` on the last
rank, so the last pipeline stage) is read through the drop-in's flag reader
(``golden.read_golden``) and set beside the last stage's ``allocated_peak_bytes`` of
``memory_report``. Each row also names the code path the case exercises, and where a
case runs a path the model leaves out, says which (from its flags, never its name).
``figures`` gives the summary statistics the tests assert; ``render`` the Markdown
section of docs/memory.md (scripts/golden_memory.py writes it).
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from primus_ext.memory.head import te_cross_entropy
from primus_ext.memory.report import memory_report, resolved_train
from primus_ext.published.golden import GoldenCase, read_golden

GIB = 2**30
# Flags of a path the memory model does not follow, with what it leaves out.
NOT_MODELLED = {
    "--cuda-graph-impl": "CUDA graphs: the captured modules' activations live in the "
                         "graphs' static memory pools, not modelled",
    "--external-cuda-graph": "CUDA graphs: static graph memory pools not modelled",
    "--enable-cuda-graph": "CUDA graphs: static graph memory pools not modelled",
}
# A peak that grows by more than this after the second logged step is data-dependent.
GROWTH_NOTE = 0.01


@dataclass(frozen=True, kw_only=True, slots=True)
class GoldenMemoryRow:
    case: str
    is_moe: bool
    measured_bytes: float  # the largest mem-max-allocated-bytes of the run
    early_bytes: float | None  # the same at the second logged step
    measured_static_bytes: float | None  # mem-allocated-bytes after the last step
    ours_bytes: int  # the last stage's allocated peak
    ours_static_bytes: int  # its weights, gradients, optimizer and allocated terms
    path: str
    note: str

    @property
    def error(self) -> float:
        return self.ours_bytes / self.measured_bytes - 1


def _attention(spec) -> str:
    t = resolved_train(spec)
    if t.attention_backend == "flash":
        return "TE fused" if t.te else "flash"
    return "TE unfused" if t.te else "local unfused"


def _loss(spec) -> str:
    t = spec.train
    if te_cross_entropy(t):
        return "CE TE"
    return "CE fused" if t.cross_entropy_loss_fusion else "CE unfused"


def case_path(spec) -> str:
    """The code path of a case, in the terms the memory model distinguishes."""
    m, p, t = spec.model, spec.parallel, resolved_train(spec)
    parts = ["TE" if t.te else "local", _attention(spec), _loss(spec)]
    if m.multi_latent_attention:
        parts.append("MLA")
    if m.is_moe:
        parts.append(f"MoE {p.moe_token_dispatcher_type} EP{p.ep}"
                     + (" grouped" if p.moe_grouped_gemm else ""))
    if m.mtp_num_layers:
        parts.append(f"MTP{m.mtp_num_layers}")
    layout = f"TP{p.tp}" + (" SP" if p.sequence_parallel else "") + f" PP{p.pp}"
    layout += f" VPP{p.vpp}" if p.vpp > 1 else ""
    layout += f" CP{p.cp}" if p.cp > 1 else ""
    parts.append(layout)
    if p.fsdp:
        parts.append("FSDP")
    elif p.use_distributed_optimizer:
        parts.append("distopt" + (f"x{p.num_distributed_optimizer_instances}"
                                  if p.num_distributed_optimizer_instances > 1 else ""))
    if t.precision == "fp8":
        parts.append(f"FP8 {t.fp8_recipe}" + (" param-gather" if t.fp8_param_gather
                                              else ""))
    elif t.precision != "bf16":
        parts.append(t.precision)
    if t.recompute_granularity:
        parts.append(f"recompute {t.recompute_granularity}")
    if t.offload_modules:
        parts.append(f"offload {len(t.offload_modules)} modules")
    if t.defer_embedding_wgrad_compute:
        parts.append("deferred embedding wgrad")
    return ", ".join(parts)


def _note(case: GoldenCase) -> str:
    notes = [why for flag, why in NOT_MODELLED.items() if flag in case.argv]
    early = case.mem_max_allocated_bytes_early
    if early and case.mem_max_allocated_bytes > early * (1 + GROWTH_NOTE):
        notes.append(f"the logged peak grows {case.mem_max_allocated_bytes / early - 1:.1%} "
                     "after the second step (data-dependent: MoE routing balance; the "
                     "model assumes balanced routing)" if case.is_moe else
                     f"the logged peak grows {case.mem_max_allocated_bytes / early - 1:.1%}"
                     " after the second step")
    return "; ".join(notes)


def golden_rows(path=None) -> list[GoldenMemoryRow]:
    """One row per golden training case with a spec and a measured peak."""
    from primus_ext.memory.overhead import DEVICE_TERMS
    rows = []
    for c in read_golden(path):
        if c.spec is None or not c.mem_max_allocated_bytes:
            continue
        st = memory_report(c.spec).stages[-1]
        static = st.param_bytes + st.grad_bytes + st.optimizer_bytes + sum(
            v for k, v in st.other if k not in DEVICE_TERMS)
        rows.append(GoldenMemoryRow(
            case=c.case, is_moe=c.is_moe, measured_bytes=c.mem_max_allocated_bytes,
            early_bytes=c.mem_max_allocated_bytes_early,
            measured_static_bytes=c.mem_allocated_bytes, ours_bytes=st.allocated_peak_bytes,
            ours_static_bytes=static, path=case_path(c.spec), note=_note(c)))
    return rows


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile: the smallest value with at least ``q`` of the values at
    or below it."""
    ordered = sorted(values)
    return ordered[max(math.ceil(q * len(ordered)) - 1, 0)]


@dataclass(frozen=True, kw_only=True, slots=True)
class Figures:
    num_cases: int
    num_moe: int
    median_abs_error: float
    p90_abs_error: float
    moe_p90_abs_error: float


def figures(rows: list[GoldenMemoryRow]) -> Figures:
    errs = [abs(r.error) for r in rows]
    moe = [abs(r.error) for r in rows if r.is_moe]
    return Figures(num_cases=len(rows), num_moe=len(moe),
                   median_abs_error=statistics.median(errs),
                   p90_abs_error=percentile(errs, 0.9),
                   moe_p90_abs_error=percentile(moe, 0.9) if moe else 0.0)


def refused(path=None) -> list[tuple[str, str]]:
    """(case, reason) of the golden training cases with a measured peak that the flag
    reader refuses."""
    return [(c.case, c.error or "") for c in read_golden(path)
            if c.spec is None and c.mem_max_allocated_bytes]


def render(rows: list[GoldenMemoryRow]) -> str:
    """The Markdown section of docs/memory.md."""
    from primus_ext.published.golden import source
    f = figures(rows)
    src = source()
    lines = [
        "## The allocated peak against Megatron-LM's GPU logs (DGX H100)", "",
        f"Megatron-LM's functional tests ({src['repository']} at {src['commit'][:12]}, "
        f"`{src['golden_file']}`) log `mem-max-allocated-bytes` "
        "(`torch.cuda.max_memory_allocated`, allocator peak) on the last rank, i.e. the "
        "last pipeline stage. Each case's flags are read by the drop-in's reader "
        "(`primus_ext/published/golden.py`) and its last stage's `allocated_peak_bytes` "
        "(the device peak less the CUDA context, NCCL buffers and fragmentation, which "
        "the allocator does not count) is set beside the largest logged value. "
        "`static` is what stays allocated after a step (`mem-allocated-bytes`) beside "
        "our weights, gradients, optimizer state, workspaces and buffers. Generated by "
        "`scripts/golden_memory.py`; asserted by "
        "`tests/memory/test_memory_vs_golden.py`.", "",
        f"Over {f.num_cases} cases: median |error| {f.median_abs_error:.1%}, p90 "
        f"{f.p90_abs_error:.1%}; over the {f.num_moe} MoE cases p90 "
        f"{f.moe_p90_abs_error:.1%} (nearest-rank percentiles).", "",
        "| case | path | measured GiB | ours GiB | error | static measured / ours GiB | "
        "why it differs |",
        "|---|---|---:|---:|---:|---|---|"]
    skipped = refused()
    if skipped:
        lines[-2:-2] = ["Not compared (the flag reader refuses them): " + "; ".join(
            f"{case} ({why.replace('|', '/')})" for case, why in skipped) + ".", ""]
    for r in sorted(rows, key=lambda r: r.error):
        static = (f"{r.measured_static_bytes / GIB:.2f} / {r.ours_static_bytes / GIB:.2f}"
                  if r.measured_static_bytes else "-")
        lines.append(f"| {r.case} | {r.path} | {r.measured_bytes / GIB:.2f} | "
                     f"{r.ours_bytes / GIB:.2f} | {r.error:+.1%} | {static} | "
                     f"{r.note.replace('|', '/')} |")
    return "\n".join(lines) + "\n"
