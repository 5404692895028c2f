"""What a profile captured against what the models say, for the run it measured (pure).

- ``collective_check``: bytes per layer per microbatch of every collective the tracer saw
  inside a layer kind (summed per axis, collective and phase) against the comm model's
  ``CommOp.num_bytes`` in the simulate backend's LayerCosts of the measured layout.
  Payloads that are not activations -- the routing weights (one value per routed row)
  and int64 token counts of the MoE dispatcher -- are compared on rows of their own
  (``payload: metadata``) with the comm model's metadata ops (``moe_comm.METADATA_OPS``).
  Group-size-1 calls (megatron-core calls collectives on trivial groups too) are
  skipped.
- ``activation_check``: saved-for-backward bytes per layer (the saved-tensor counter)
  against the memory model's ``layer_bytes`` with the measured attention backend.
- ``p2p_check``: bytes of one pipeline send against the comm model's ``p2p_bytes``.
"""
from __future__ import annotations

import dataclasses
from collections import defaultdict

from primus_ext.comm.moe_comm import METADATA_OPS
from primus_ext.project.profile import Profile
from primus_ext.spec import RunSpec

ACTIVATION_DTYPES = ("bfloat16", "float16", "float32", "float8_e4m3fn", "float8_e5m2")
IN_LAYER = ("tp", "cp", "ep", "etp", "tp_ep")


def _measured(profile: Profile, base: RunSpec) -> RunSpec:
    from primus_ext.project.from_profile import measured_spec
    return measured_spec(profile, base)


def _is_metadata(c, biggest: dict) -> bool:
    """Integer and boolean payloads (token counts, routing maps), and EP collectives far
    smaller than the token collective of the same kind in the same layer and phase (the
    routing weights or probabilities: one value per row or per expert)."""
    if c.dtype.startswith(("int", "uint", "bool")):
        return True
    if c.axis in ("ep", "tp_ep"):
        return c.num_bytes * 16 < biggest.get((c.kind, c.phase, c.collective), 0.0)
    return False


def _status(captured: float, model: float, tol: float) -> str:
    if model == 0 and captured == 0:
        return "match"
    if model == 0:
        return "extra"
    if captured == 0:
        return "missing"
    return "match" if abs(captured - model) <= tol * model else "differs"


def collective_check(profile: Profile, base: RunSpec, tol: float = 0.01) -> list[dict]:
    """Rows {kind, axis, collective, phase, captured_bytes, model_bytes, status}."""
    from primus_ext.project.simulate_backend import simulate_layer_costs
    meas = _measured(profile, base)
    costs = simulate_layer_costs(meas)
    captured: dict[tuple, float] = defaultdict(float)
    metadata: dict[tuple, float] = defaultdict(float)
    biggest: dict[tuple, float] = defaultdict(float)
    for c in profile.collectives:
        if c.axis in ("ep", "tp_ep"):
            key = (c.kind, c.phase, c.collective)
            biggest[key] = max(biggest[key], c.num_bytes)
    for c in profile.collectives:
        if c.kind not in costs.kinds or c.group_size <= 1 or c.axis not in IN_LAYER:
            continue
        axis = "ep" if c.axis == "tp_ep" and meas.parallel.expert_tp == 1 else c.axis
        key = (c.kind, axis, c.collective, c.phase)
        if _is_metadata(c, biggest):
            metadata[key] += c.num_bytes * c.count
        else:
            captured[key] += c.num_bytes * c.count
    model: dict[tuple, float] = defaultdict(float)
    model_meta: dict[tuple, float] = defaultdict(float)
    for kind in set(k for k, *_ in captured) | set(k for k, *_ in metadata) | {
            k for k in costs.kinds if k in profile.layers}:
        for op in costs.kinds[kind].comms:
            if op.axis in IN_LAYER and op.group_size > 1:
                into = model_meta if op.name in METADATA_OPS else model
                into[(kind, op.axis, op.collective, op.phase)] += op.num_bytes
    rows = []
    for payload, got, want in (("activations", captured, model),
                               ("metadata", metadata, model_meta)):
        for key in sorted(set(got) | set(want)):
            kind, axis, coll, phase = key
            rows.append({"kind": kind, "axis": axis, "collective": coll, "phase": phase,
                         "payload": payload, "captured_bytes": got.get(key, 0.0),
                         "model_bytes": want.get(key, 0.0),
                         "status": _status(got.get(key, 0.0), want.get(key, 0.0), tol)})
    return rows


def activation_check(profile: Profile, base: RunSpec, tol: float = 0.0) -> list[dict]:
    """Rows {kind, captured_bytes, model_bytes, cpu_delta, status} for the decoder layer
    kinds. On a CPU the model's bytes get the memory engineer's named CPU-only delta
    (``memory.cpu_delta.cpu_delta_bytes``: torch's composite RMSNorm saves fp32 copies)."""
    from primus_ext.memory.activations import layer_items
    from primus_ext.memory.options import MemoryOptions
    meas = _measured(profile, base)
    backend = profile.measured_shapes.get("attention_backend", meas.train.attention_backend)
    # The layer stack the run built: TE's (flash attention) or the local spec, whatever
    # the target's line asked for (--transformer-impl).
    train = dataclasses.replace(meas.train, attention_backend=backend,
                                te=backend == "flash")
    spec = dataclasses.replace(meas, train=train)
    rows = []
    for kind in ("dense", "moe"):
        kt = profile.layers.get(kind)
        if kt is None or kt.activation_bytes is None:
            continue
        items = dict(layer_items(meas.model, meas.parallel, train, kind == "moe",
                                 MemoryOptions()))
        model = sum(items.values())
        delta = 0
        if profile.device.get("kind") == "cpu":
            from primus_ext.memory.cpu_delta import cpu_delta_bytes
            delta = cpu_delta_bytes(spec, items)
        rows.append({"kind": kind, "captured_bytes": kt.activation_bytes,
                     "model_bytes": model, "cpu_delta": delta,
                     "status": _status(kt.activation_bytes - delta, model, tol)})
    return rows


def flops_check(profile: Profile, base: RunSpec, tol: float = 0.02) -> list[dict]:
    """Executed FLOPs of one microbatch the tracer's run counted (``FlopCounterMode``:
    matmuls and attention) against the simulate backend's ``fwd_flops``/``bwd_flops`` of
    the measured layout: forward per decoder kind and output layer, and the total."""
    from primus_ext.project.simulate_backend import simulate_layer_costs
    got = profile.step.get("executed_flops_per_microbatch") or {}
    if not got:
        return []
    meas = _measured(profile, base)
    # Like with like: the measured model is megatron-core's local spec
    # (frameworks/megatron/model.py build_model), whose core attention
    # (DotProductAttention) multiplies the whole score matrix and masks it afterwards;
    # FlopCounterMode counts those FLOPs. The simulated flash kernel skips the causal
    # half, so the check takes the unfused kernel's count.
    meas = dataclasses.replace(meas, train=dataclasses.replace(
        meas.train, attention_backend="unfused"))
    sim = simulate_layer_costs(meas)
    rows = []
    for kind in ("dense", "moe", "output"):
        key = f"{kind}_fwd_flops"
        if key in got and kind in sim.kinds:
            rows.append({"kind": kind, "axis": "fwd FLOPs", "captured_bytes": got[key],
                         "model_bytes": sim.kinds[kind].fwd_flops,
                         "status": _status(got[key], sim.kinds[kind].fwd_flops, tol)})
    total = sum(sim.decoder_layer(i).fwd_flops + sim.decoder_layer(i).bwd_flops
                for i in range(meas.model.num_layers))
    total += sum(sim.kinds[k].fwd_flops + sim.kinds[k].bwd_flops
                 for k in ("embedding", "output") if k in sim.kinds)
    if "total_flops" in got:
        rows.append({"kind": "microbatch", "axis": "fwd+bwd FLOPs",
                     "captured_bytes": got["total_flops"], "model_bytes": total,
                     "status": _status(got["total_flops"], total, tol)})
    return rows


def p2p_check(profile: Profile, target: RunSpec) -> list[dict]:
    """The pipeline probe's send bytes against the comm model's, for ``target``."""
    from primus_ext.comm.step_comm import p2p_bytes
    rows = []
    for c in profile.collectives:
        if c.kind == "pipeline" and c.collective == "p2p":
            model = p2p_bytes(target)
            rows.append({"kind": "pipeline", "axis": "pp", "captured_bytes": c.num_bytes,
                         "model_bytes": model, "status": _status(c.num_bytes, model, 0.0)})
    return rows


def format_rows(rows: list[dict]) -> list[str]:
    out = []
    for r in rows:
        label = " ".join(str(r[k]) for k in ("kind", "axis", "collective", "phase") if k in r)
        if r.get("payload") == "metadata":
            label += " (metadata)"
        extra = f" (+{r['cpu_delta']:,} B CPU norms)" if r.get("cpu_delta") else ""
        unit = "" if "FLOPs" in str(r.get("axis", "")) else " B"
        out.append(f"{label:<36} captured {r['captured_bytes']:>15,.0f}{unit}  "
                   f"model {r['model_bytes']:>15,.0f}{unit}{extra}  {r['status']}")
    return out


def check_notes(profile: Profile, target: RunSpec) -> tuple[str, ...]:
    """One line each for the collective and activation checks (the notes a projection
    from a profile measured on other hardware carries)."""
    rows = collective_check(profile, target)
    acts = activation_check(profile, target)
    ok = sum(r["status"] == "match" for r in rows)
    ok_a = sum(r["status"] == "match" for r in acts)
    return (f"check: captured collective bytes per layer vs comm model (measured layout): "
            f"{ok} of {len(rows)} match",
            f"check: saved activation bytes per layer vs memory model: {ok_a} of "
            f"{len(acts)} match")
