"""mode=project: one projection (simulate backend, or a measured profile)."""
from __future__ import annotations

import dataclasses
import json
import sys

from primus_ext.config import layout_note, spec_and_notes
from primus_ext.emit.console import gib, print_json, print_table
from primus_ext.project.estimate import project
from primus_ext.util.files import atomic_write_text, output_path


def _estimate(cfg, spec, record: bool):
    calibration = cfg.get("calibration", "default")
    if cfg.get("backend", "simulate") == "profile":
        from primus_ext.project.from_profile import estimate_from_profile, same_hardware
        if not cfg.get("profile"):
            raise ValueError("backend=profile needs profile=FILE (a saved Profile JSON)")
        from primus_ext.project.profile import Profile
        profile = Profile.load(cfg.profile)
        est = estimate_from_profile(profile, spec, calibration=calibration,
                                    record_timeline=record)
        if not same_hardware(profile, spec):
            # Times come from the target's model; say whether the bytes the run captured
            # agree with the comm and memory models (measurement-side checks).
            from primus_ext.measure.checks import check_notes
            est = dataclasses.replace(est, notes=est.notes + check_notes(profile, spec))
        return est
    if cfg.get("backend", "simulate") != "simulate":
        raise ValueError(f"backend={cfg.backend!r} must be 'simulate' or 'profile'")
    return project(spec, calibration=calibration, record_timeline=record)


def run(cfg) -> dict:
    spec, unstated = spec_and_notes(cfg)
    for key in ("trace", "plot"):  # fail before the work, not after it
        if cfg.get(key):
            output_path(cfg[key], key)
    want_timeline = bool(cfg.get("plot") or cfg.get("trace"))
    est = _estimate(cfg, spec, want_timeline)
    out = est.to_dict()
    note = layout_note(cfg)
    if note:
        out["layout_note"] = note
    if unstated:
        out["unstated"] = unstated
    if cfg.get("backend", "simulate") == "simulate":
        from primus_ext.project.calibration import calibration_note
        out["calibration"] = calibration_note(cfg.get("calibration", "default"),
                                              spec.cluster.hardware.name)
    if not est.fits:  # the way out: the cheapest recompute that fits (memory/fit_ladder.py)
        from primus_ext.memory.fit_ladder import cheapest_fit
        out["suggestion"] = cheapest_fit(spec).note
    if cfg.get("trace"):
        from primus_ext.project.trace import MAX_EVENTS, to_chrome_trace
        cap = cfg.get("trace_max_events", MAX_EVENTS)
        trace = to_chrome_trace(est.timeline, max_events=cap)
        atomic_write_text(cfg.trace, json.dumps(trace), "trace")
        info = trace["primus_ext"]
        if info["truncated"]:
            print(f"primus-ext: trace {cfg.trace}: drew the first {info['ops_drawn']:,} of "
                  f"{info['ops_total']:,} ops (up to {info['drawn_until_s']:.3g} s of the "
                  f"{info['step_s']:.3g} s step); trace_max_events={cap} sets the cap "
                  "(null: draw all)", file=sys.stderr)
    if cfg.get("plot"):
        from primus_ext.emit.plots import plot_timeline
        plot_timeline(est, cfg.plot)
    if cfg.output == "json":
        print_json(out)
    else:
        print_estimate(spec, est)
        if out.get("suggestion"):
            print(f"note: {out['suggestion']}")
        if out.get("calibration"):
            print(f"note: {out['calibration']}")
        if note:
            print(f"note: {note}")
        for note in unstated:
            print(f"note: {note}")
    return out


def print_estimate(spec, est) -> None:
    p = spec.parallel
    title = (f"{spec.model.name} on {spec.world_size} x {spec.cluster.hardware.name} | "
             f"TP{p.tp} PP{p.pp} VPP{p.vpp} CP{p.cp} EP{p.ep} DP{spec.dp} | "
             f"GBS {spec.train.global_batch_size} MBS {spec.train.micro_batch_size} "
             f"seq {spec.train.seq_length} {spec.train.precision}")
    if spec.framework == "torchtitan":  # its own axes and switches
        t = spec.train
        title += (f" | torchtitan: FSDP2 dp_shard {spec.dp // p.dp_replicate} x "
                  f"dp_replicate {p.dp_replicate}, AC {t.activation_checkpoint}, compile "
                  f"{'on' if t.compile else 'off'}"
                  + (f", {p.schedule}" if p.pp > 1 else ""))
    rows = [("step time (s)", est.step_time_s),
            ("tokens/s/GPU", est.tokens_per_s_per_gpu),
            ("model TFLOP/s/GPU", est.tflops_per_gpu),
            ("MFU", f"{est.mfu:.1%}"),
            ("peak memory (GiB)", f"{gib(est.peak_memory_bytes):.1f} of "
                                  f"{gib(est.memory.device_bytes):.1f}"),
            ("fits", est.fits)]
    band = est.error_band()
    if band:
        tb, sb = band["tokens_per_s_per_gpu"], band["step_time_s"]
        rows[2:2] = [(f"  tokens/s/GPU {tb['coverage']:.0%} band",
                      f"{tb['low']:,.0f} - {tb['high']:,.0f}"),
                     (f"  step time {sb['coverage']:.0%} band (s)",
                      f"{sb['low']:.4g} - {sb['high']:.4g}")]
    for key, value in est.breakdown.items():
        share = value / est.step_time_s if est.step_time_s else 0.0
        rows.append((f"  {key[:-2].replace('_', ' ')} (s)", f"{value:.4f}  ({share:.1%})"))
    print_table(title, ["quantity", "value"], rows,
                caption=f"FLOPs: {est.flop_formula}; backend: {est.backend}; "
                        f"schedule {est.schedule}, {est.num_microbatches} microbatches"
                        + (f"; band: measured/projected of held-out runs of "
                           f"{band['tokens_per_s_per_gpu']['basis']}" if band else ""))
