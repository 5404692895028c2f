"""report.md of a tuning run: the winner against the baseline (and why it is faster, in
terms of the step-time breakdown), the published reference layout, the top-k table, the
throughput/cost Pareto front of cluster planning, and the search statistics."""
from __future__ import annotations

from primus_ext.compute.model_flops import FORMULA_NAME
from primus_ext.emit.tune_ties import against_winner, band_cell, recommendation_section, \
    verdict
from primus_ext.tune.pareto import cluster_bests, gpu_hours_per_mtok
from primus_ext.tune.space import AXES, as_dict, describe

_GIB = 2**30
_PARTS = ("compute_s", "recompute_s", "tp_comm_s", "cp_comm_s", "ep_comm_s",
          "pp_bubble_s", "dp_comm_s", "optimizer_s", "host_pause_s")


def _f(v, nd=3) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        if abs(v) >= 100:  # throughputs: whole tokens
            return f"{v:,.0f}"
        return f"{v:.{nd}f}"
    return str(v)


def _gib(metrics: dict) -> str:
    return f"{metrics['peak_memory_bytes'] / _GIB:.1f}"


def _alloc_gib(metrics: dict) -> str:
    v = metrics.get("allocated_peak_bytes")
    return "-" if v is None else f"{v / _GIB:.1f}"


def _memory(spec) -> list[str]:
    """The winner's memory per stage, allocated peak beside device peak, terms named."""
    from primus_ext.emit.memory_rows import stage_lines, stage_table
    from primus_ext.memory.report import memory_report
    rep = memory_report(spec)
    header, rows = stage_table(rep)
    return (["## Winner's memory per stage (GiB)", "",
             "Allocated peak: what `torch.cuda.max_memory_allocated` (Megatron-LM's "
             "`mem-max-allocated-bytes`) reports on a rank of the stage; device peak: "
             "that plus the CUDA context, NCCL buffers and allocator fragmentation, "
             "outside PyTorch's allocator.", ""]
            + _table(header, rows) + [""] + [f"- {line}" for line in stage_lines(rep)]
            + [""])


def _table(header: list[str], rows: list[list]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(_f(c) if not isinstance(c, str) else c for c in r) + " |"
            for r in rows]
    return out


def _why(base: dict, win: dict) -> list[str]:
    """Where the step time went, baseline -> winner, biggest saving first."""
    gain = base["step_time_s"] - win["step_time_s"]
    bb, wb = base["breakdown"], win["breakdown"]
    deltas = sorted(((k, bb.get(k, 0.0) - wb.get(k, 0.0)) for k in _PARTS),
                    key=lambda kv: -abs(kv[1]))
    lines = []
    saved = sum(d for _, d in deltas if d > 0)
    for k, d in deltas:
        if abs(d) < 1e-4 * max(base["step_time_s"], 1e-9):
            continue
        verb = "saves" if d > 0 else "costs"
        lines.append(f"- {k[:-2].replace('_', ' ')}: {bb.get(k, 0.0):.3f} s -> "
                     f"{wb.get(k, 0.0):.3f} s ({verb} {abs(d):.3f} s)")
    if lines:
        lines.append(f"- net: {saved:.3f} s saved - {saved - gain:.3f} s spent = "
                     f"{gain:.3f} s per step")
    return lines


def _changes(a: tuple, b: tuple) -> str:
    da, db = as_dict(a), as_dict(b)
    diffs = [f"{k} {da[k]} -> {db[k]}" for k in AXES if da[k] != db[k]]
    return ", ".join(diffs) if diffs else "none"


def render_report(result, overrides: list[str]) -> str:
    r, s = result, result.settings
    spec, best = r.best_spec, r.best
    bm = best.metrics
    job = r.base_spec
    is_moe = job.model.is_moe
    L = [f"# primus-ext tune: {job.model.name}, GBS {job.train.global_batch_size}, "
         f"seq {job.train.seq_length}, {job.train.precision}",
         "",
         f"Winner on {spec.world_size} x {spec.cluster.hardware.name} "
         f"({spec.cluster.num_nodes} nodes): **{describe(best.point)}**, DP {spec.dp}, "
         f"{spec.num_microbatches} microbatches"
         + (" (interrupted: best so far)" if r.interrupted else ""),
         "",
         f"Objective: {s.objective}; strategy: {r.strategy}; backend: {bm.get('backend')}. "
         f"Model FLOPs: {FORMULA_NAME} (MFU against the dense peak of the run's "
         "precision).",
         "",
         "Reproduce the projection: `xargs -d '\\n' -a overrides.txt primus-ext mode=project`; "
         "launch: "
         f"`{'torchtitan' if spec.framework == 'torchtitan' else 'megatron'}_args.sh`.", ""]
    L += ["## Winner against the baseline", ""]
    base = r.baseline
    cmp_trial = base if base is not None and base.verdict == "ok" else r.start
    if base is not None and base.verdict != "ok":
        L += [f"The given layout ({describe(base.point)}) is {base.verdict}: {base.reason}. "
              f"Compared against the nearest working layout instead "
              f"({describe(r.start.point)}).", ""]
    if cmp_trial is not None and cmp_trial.verdict == "ok":
        cm = cmp_trial.metrics
        rows = [["step time (s)", cm["step_time_s"], bm["step_time_s"]],
                ["tokens/s/GPU", cm["tokens_per_s_per_gpu"], bm["tokens_per_s_per_gpu"]],
                ["  80% band", band_cell(cm, is_moe), band_cell(bm, is_moe)],
                ["model TFLOP/s/GPU", f"{cm['tflops_per_gpu']:.0f}",
                 f"{bm['tflops_per_gpu']:.0f}"],
                ["MFU", f"{cm['mfu']:.1%}", f"{bm['mfu']:.1%}"],
                ["peak memory (GiB)", _gib(cm), _gib(bm)],
                ["  allocated peak (GiB)", _alloc_gib(cm), _alloc_gib(bm)]]
        rows += [[f"  {k[:-2].replace('_', ' ')} (s)", cm["breakdown"].get(k, 0.0),
                  bm["breakdown"].get(k, 0.0)] for k in _PARTS]
        L += _table(["", f"baseline: {describe(cmp_trial.point)}",
                     f"winner: {describe(best.point)}"], rows)
        speedup = bm["tokens_per_s_per_gpu"] / cm["tokens_per_s_per_gpu"] - 1
        L += ["", f"Changes: {_changes(cmp_trial.point, best.point)}.", "",
              f"Winner against the baseline: {verdict(bm, cm, is_moe)}.", "",
              f"Where the projected difference comes from ({speedup:+.1%} tokens/s/GPU; step time "
              f"{cm['step_time_s']:.3f} s -> {bm['step_time_s']:.3f} s), by breakdown "
              "component on the critical pipeline stage:"]
        L += _why(cm, bm) or ["- no difference: the baseline is the winner"]
        L.append("")
    L += recommendation_section(r)
    L += _memory(spec)
    L += _headroom(r)
    L += _reference(r)
    L += [f"## Top {s.top_k}", ""]
    rows = []
    kinds = len({t.candidate["hardware"] for t in r.top(10**9)}) > 1
    for i, t in enumerate(r.top(s.top_k), 1):
        m = t.metrics
        # Several GPU kinds: each row says which GPU and nodes it is for, and its memory
        # against that GPU's own capacity.
        gpu = ([f"{t.candidate['hardware']} x {t.candidate['num_nodes']} nodes",
                f"{_gib(m)} / {m['device_bytes'] / _GIB:.0f}"] if kinds else [_gib(m)])
        rows.append([str(i), describe(t.point) + (" (tight)" if m.get("memory_tight") else ""),
                     m["step_time_s"], m["tokens_per_s_per_gpu"], f"{m['mfu']:.1%}"] + gpu
                    + [m["breakdown"].get(k, 0.0) for k in _PARTS] + [t.source]
                    + [against_winner(t, best, is_moe)])
    L += _table(["#", "layout", "step s", "tok/s/GPU", "MFU"]
                + (["GPU", "mem / capacity GiB"] if kinds else ["mem GiB"])
                + [k[:-2].replace("_", " ") for k in _PARTS] + ["found by", "vs winner"],
                rows)
    L.append("")
    L += _pareto(r)
    L += _search(r)
    L += ["## Overrides", "", "```", *overrides, "```", ""]
    return "\n".join(L)


def _headroom(r) -> list[str]:
    """A winner whose peak is within tune.memory_margin of the device is tight: a risk
    the memory model's error may turn into an out-of-memory. Name the best layout with
    comfortable headroom beside it."""
    margin = r.settings.memory_margin
    bm = r.best.metrics
    if not bm.get("memory_tight"):
        return []
    over = bm.get("memory_over_device")
    L = ["## Memory risk", "",
         f"The winner's peak ({_gib(bm)} GiB of {bm['device_bytes'] / _GIB:.1f} GiB) is "
         + ("over the device by the memory model, but the layout is a published one "
            "that ran: **tight**." if over else
            f"within the tune.memory_margin of {margin:.0%}: **tight**.")]
    roomy = next((t for t in r.top(10**9) if not t.metrics.get("memory_tight")), None)
    if roomy is None:
        L.append("No scored layout has comfortable headroom.")
    else:
        m = roomy.metrics
        L.append(f"Best layout with comfortable headroom: **{describe(roomy.point)}**, "
                 f"{m['tokens_per_s_per_gpu']:,.0f} tokens/s/GPU "
                 f"({m['tokens_per_s_per_gpu'] / bm['tokens_per_s_per_gpu'] - 1:+.1%} "
                 f"against the winner), peak {_gib(m)} GiB.")
    return L + [""]


def _reference(r) -> list[str]:
    ref = r.reference
    if not ref:
        return []
    L = [f"## Published reference layout ({ref['run_id']})", "",
         f"Source: {ref['source']}." + ("" if ref["same_job"] else
                                        " Note: that run's job differs from this one.")]
    proj = ref.get("projected")
    bm = r.best.metrics
    is_moe = r.base_spec.model.is_moe
    if ref.get("verdict") not in (None, "ok"):
        L.append(f"Under this memory model the reference layout is {ref['verdict']}"
                 f" ({ref.get('reason')}); it is projected regardless.")
    L.append("")
    rows = [["reference " + ref["layout"],
             ref.get("measured_tokens_per_s_per_gpu"),
             proj["tokens_per_s_per_gpu"] if proj else None,
             proj["step_time_s"] if proj else None,
             f"{proj['mfu']:.1%}" if proj else "-", _gib(proj) if proj else "-"],
            ["winner " + describe(r.best.point), None, bm["tokens_per_s_per_gpu"],
             bm["step_time_s"], f"{bm['mfu']:.1%}", _gib(bm)]]
    L += _table(["layout", "measured tok/s/GPU", "projected tok/s/GPU", "step s", "MFU",
                 "mem GiB"], rows)
    if ref.get("gain") is not None:
        L += ["", f"Projected gain of the winner over the reference layout: "
                  f"**{ref['gain']:+.1%}** tokens/s/GPU (same projector for both): "
                  f"{verdict(bm, proj, is_moe, bool(ref.get('recompute_inferred')))}."
              + (" The source did not state the reference's recompute: the reader "
                 "inferred it, and its band is that of inferred rows."
                 if ref.get("recompute_inferred") else "")]
        meas = ref.get("measured_tokens_per_s_per_gpu")
        if meas:
            L.append(f"Applied to the measured {meas:,.0f} tokens/s/GPU that would be about "
                     f"{meas * (1 + ref['gain']):,.0f} tokens/s/GPU.")
    if proj:
        L += ["", "Where the reference's step goes: " + ", ".join(
            f"{k[:-2].replace('_', ' ')} {proj['breakdown'].get(k, 0.0):.3f} s"
            for k in _PARTS)]
    L.append("")
    return L


def _pareto(r) -> list[str]:
    if not r.pareto:
        return []
    priced = any(t.metrics.get("cost_per_mtok") is not None for t in r.pareto)
    L = ["## Cluster planning: throughput against cost", "",
         "Best layout per cluster; the Pareto front (no other cluster is both faster and "
         "cheaper) is marked." + ("" if priced else " No GPU-hour price given: cost is "
                                  "GPU-hours per million tokens."), ""]
    front = {id(t) for t in r.pareto}
    rows = []
    for t in cluster_bests(r.top(10**9)):
        m = t.metrics
        cost = m.get("cost_per_mtok")
        rows.append(["*" if id(t) in front else "", m["hardware"], str(m["num_nodes"]),
                     str(m["world_size"]), describe(t.point), m["tokens_per_s"],
                     m["tokens_per_s_per_gpu"], m["step_time_s"],
                     cost if cost is not None else gpu_hours_per_mtok(m)])
    L += _table(["front", "hardware", "nodes", "GPUs", "layout", "tokens/s",
                 "tok/s/GPU", "step s", "cost/Mtok" if priced else "GPU-h/Mtok"], rows)
    L.append("")
    return L


def _search(r) -> list[str]:
    sp, st = r.space, r.stats
    L = ["## Search", "",
         f"- space: {sp['num_raw']:,} points, {sp['num_distinct']:,} distinct after "
         f"normalisation, {sp['num_legal']:,} legal",
         f"- strategy {r.strategy}: {st['evaluated']:,} candidates evaluated, "
         f"{st['projected']:,} projected, in {st['seconds']:.1f} s "
         f"(budget {st['budget']['candidates']} candidates"
         + (f" per cluster x {st['budget']['num_clusters']} clusters"
            if st["budget"].get("num_clusters", 1) > 1 else "")
         + f", {st['budget']['seconds']} s)",
         "- rejected: " + (", ".join(f"{k} {v}" for k, v in st["rejected_by_reason"].items())
                           or "none")]
    for k, v in sp["illegal_by_reason"].items():
        L.append(f"- illegal ({v}): {k}")
    for k, v in sp["skipped_by_reason"].items():
        L.append(f"- skipped ({v}): {k}")
    L.append("- axes: " + "; ".join(f"{a} {v}" for a, v in sp["axes"].items()))
    if r.llm_rounds or r.llm_note:
        L += ["", "### LLM investigation", ""]
        if r.llm_note:
            L.append(f"- {r.llm_note}")
        for rnd in r.llm_rounds:
            if not rnd.ok:
                L.append(f"- round {rnd.round}: failed ({rnd.error})")
                continue
            ok = [p for p in rnd.proposals if p.get("verdict") == "ok"]
            L.append(f"- round {rnd.round}: {len(rnd.proposals)} proposals, {len(ok)} "
                     f"scored; best {_f(rnd.best_before, 1)} -> {_f(rnd.best_after, 1)}")
            for p in rnd.proposals:
                hyp = (p.get("proposal") or {}).get("hypothesis", "") \
                    if isinstance(p.get("proposal"), dict) else ""
                fig = p.get("tokens_per_s_per_gpu")
                L.append(f"  - {p.get('verdict')}: {hyp[:140]}"
                         + (f" -> {fig:,.0f} tok/s/GPU" if fig else
                            f" ({p.get('reason')})" if p.get("reason") else ""))
    L.append("")
    return L
