"""The golden section of docs/accuracy.md: Megatron-LM's GPU-measured functional tests.

Every training case of ``tests/data/megatron_golden/h100.json`` (Megatron-LM's
``golden_values_dev_dgx_h100.json`` with its ``model_config.yaml`` flags and the h100
recipes' node counts; ``scripts/golden_dataset.py``) read by the drop-in's flag reader
and projected with the committed calibration, against the median iteration time
Megatron-LM logged; beside it the leave-one-family-out figure (each family's host
constants fitted on the other families alone). Used by scripts/accuracy_report.py.
"""
from __future__ import annotations

import time

from primus_ext.modes.calibrate import held_out_host_results
from primus_ext.project.validate import percentile, project_run
from primus_ext.published import DEFAULT_PATH, read_runs
from primus_ext.published.golden import as_runs, read_golden, source

# What tests/project/test_golden.py asserts; the target for the p90 is 30 %.
GOLDEN_BOUNDS = dict(med=0.15, p90=0.35)
GOLDEN_TARGET_P90 = 0.30


def _pct(x: float) -> str:
    return f"{x:.1%}"


def _step_error(r) -> float:
    """Error of the projected step time against the measured iteration time."""
    return 1.0 / (1.0 + r.rel_error) - 1.0


def _path(spec) -> str:
    """What a case exercises, in a few words."""
    m, p, t = spec.model, spec.parallel, spec.train
    bits = [f"TP{p.tp} PP{p.pp}" + (f" VP{p.vpp}" if p.vpp > 1 else "")
            + (f" CP{p.cp}" if p.cp > 1 else "") + (f" EP{p.ep}" if p.ep > 1 else ""),
            f"{spec.num_microbatches} mb", "TE" if t.te is not False else "local"]
    if m.is_moe:
        bits.append(f"MoE {m.num_moe_experts}e top{m.moe_router_topk} "
                    f"{p.moe_token_dispatcher_type}"
                    + (" grouped" if p.moe_grouped_gemm else " sequential")
                    + (f" {p.moe_router_load_balancing_type}"
                       if p.moe_router_load_balancing_type == "sinkhorn" else ""))
    if m.multi_latent_attention:
        bits.append("MLA")
    if t.deterministic_mode:
        bits.append("deterministic")
    if t.recompute_granularity:
        bits.append(f"recompute {t.recompute_granularity}")
    if t.cuda_graph_scope:
        bits.append("graphs " + "+".join(t.cuda_graph_scope))
    if t.offload_modules:
        bits.append("offload")
    if t.precision != "bf16":
        bits.append(t.precision)
    return ", ".join(bits)


def golden_section(calib, lofo: bool = True) -> list[str]:
    cases = read_golden(timed_only=True)
    refused = [c for c in read_golden() if c.spec is None]
    runs = as_runs(cases)
    results = [project_run(r, calib) for r in runs]
    by_id = {c.case: c for c in cases}
    errs = [abs(_step_error(r)) for r in results if r.rel_error is not None]
    src = source()
    lines = ["## Megatron-LM's GPU-measured functional tests (golden values, DGX H100)", "",
             f"{len(errs)} training cases of github.com/NVIDIA/Megatron-LM@"
             f"{src['commit'][:12]} ({src['commit_date'][:10]}): the real `pretrain_gpt.py` "
             "flags of each case's `model_config.yaml`, read by the drop-in "
             "(`launch/pretrain_gpt.py`) as a user's line, on the node count of its h100 "
             "recipe, projected with the committed calibration and compared with the "
             "median `iteration-time` Megatron-LM logged after the first "
             f"{src['warmup_iterations_dropped']} iterations "
             "(`tests/data/megatron_golden/`, built by `scripts/golden_dataset.py`). "
             "Most are small models (12 layers, hidden 512) whose step is what the "
             "host issues: the host clock (`primus_ext/compute/host.py`, "
             "`project/host_step.py`) with the H100 host constants fitted on these "
             "cases by `mode=calibrate`. "
             f"Acceptance (`tests/project/test_golden.py`): median <= "
             f"{GOLDEN_BOUNDS['med']:.0%}, p90 <= {GOLDEN_BOUNDS['p90']:.0%} (the target "
             f"for the p90 is {GOLDEN_TARGET_P90:.0%}; the cases past it are listed "
             "below). Errors are of the step time: projected over measured, less one.",
             ""]
    lines += ["| projection | cases | median abs error | p90 abs error |",
              "| --- | ---: | ---: | ---: |",
              f"| calibrated | {len(errs)} | **{_pct(percentile(errs, 50))}** | "
              f"**{_pct(percentile(errs, 90))}** |"]
    if lofo:
        t = time.time()
        held = held_out_host_results(read_runs(DEFAULT_PATH), runs, warm=calib)
        h_errs = [abs(_step_error(r)) for r in held if r.rel_error is not None]
        lines.append(f"| leave-one-family-out | {len(h_errs)} | "
                     f"**{_pct(percentile(h_errs, 50))}** | "
                     f"**{_pct(percentile(h_errs, 90))}** |")
        for fam in sorted({r.source for r in held}):
            fe = [abs(_step_error(r)) for r in held if r.source == fam]
            lines.append(f"| held out: {fam} | {len(fe)} | {_pct(percentile(fe, 50))} | "
                         f"{_pct(percentile(fe, 90))} |")
        lines += ["", f"({time.time() - t:.0f} s to compute the held-out fits.)"]
    if refused:
        lines += ["", "Not projected (the reader refuses the line): "
                  + "; ".join(f"`{c.case}` ({c.error})" for c in refused) + "."]
    worst = sorted(results, key=lambda r: -abs(_step_error(r)))
    past = [r for r in worst if abs(_step_error(r)) > GOLDEN_TARGET_P90]
    if past:
        lines += ["", f"Past {GOLDEN_TARGET_P90:.0%}: " + "; ".join(
            f"`{r.run_id}` {_step_error(r):+.0%}" for r in past) + "."]
    lines += ["", "| case | path | measured s | projected s | error | host share |",
              "| --- | --- | ---: | ---: | ---: | ---: |"]
    for r in results:
        c, e = by_id[r.run_id], r.estimate
        lines.append(f"| {c.case} | {_path(c.spec)} | {c.iteration_time_s:.3f} | "
                     f"{e.step_time_s:.3f} | {_step_error(r):+.0%} | "
                     f"{e.breakdown.get('host_s', 0.0) / e.step_time_s:.0%} |")
    return lines
