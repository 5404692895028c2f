"""A layer's phases op by op in issue order, for the two clocks (project/stages.py
``run_clocks``): ARCHITECTURE.md "two clocks", each kernel starts no earlier than the
host has issued it, so a stretch of short kernels is host-bound and a long GEMM issued
after it runs on past the host.

Each step is (host seconds, device seconds, kernels, synchronises after). A phase's host
seconds (compute/host.py) fall where they are spent: each op's launches on the op,
Transformer Engine's per-GEMM host time of a grouped linear on the expert GEMMs, and the
rest (megatron-core's Python, the module calls, the collectives' enqueue) evenly over
the phase's ops. The device seconds are the ops' compute only: the phase's collectives
stay in the two-block view (project/stages.py takes the longer of the two runs), so
that faster compute, which may expose more of a collective, never lengthens this one.
"""
from __future__ import annotations

from dataclasses import dataclass

Step = tuple[float, float, float, bool]
# The ops a grouped linear's per-GEMM host time belongs to (compute/layer_ops.py).
EXPERT_GEMMS = ("experts_fc1", "experts_fc2")


@dataclass(frozen=True, slots=True)
class HostRates:
    """Seconds per launch and per grouped-linear GEMM (0 without Transformer Engine),
    and the kernels each op launch costs (deterministic fills included)."""
    launch_s: float
    grouped_gemm_s: float
    fill: int = 1


def _steps(parts, host_s: float, grouped_s: float, rates: HostRates,
           sync_after: int | None) -> list[Step]:
    """``parts``: (device seconds, kernels, counts as ops, is an expert GEMM)."""
    n_gemm = sum(1 for *_, g in parts if g)
    launches = sum(k for _, k, _, _ in parts) * rates.launch_s
    grouped = grouped_s if n_gemm else 0.0
    rest = max(host_s - launches - grouped, 0.0)
    n_ops = sum(n for _, _, n, _ in parts) or 1.0
    scale = 1.0 if rest > 0 else host_s / max(launches + grouped, 1e-30)
    out = []
    for i, (d, k, n, gemm) in enumerate(parts):
        own = (k * rates.launch_s + (grouped / n_gemm if gemm else 0.0)) * scale
        out.append((own + rest * n / n_ops, d, k, i == sync_after))
    return out


def _part(o, fwd: bool, fill: int):
    k = float(max(fill * (o.fwd_kernels if fwd else o.bwd_kernels), 1))
    d = o.fwd_s if fwd else o.dgrad_s + o.wgrad_s
    return d, k, 1.0, o.name in EXPERT_GEMMS


def forward_issue(ops, post: frozenset[str], rates: HostRates, host_s: float,
                  post_host_s: float, expert_gemms: float) -> tuple[Step, ...]:
    """An MoE layer's forward: its ops up to its synchronisation (attention, the pre-MLP
    norm, the router, the dispatcher's preprocessing, the shared experts), the read-back
    of the token counts, then the ops after it (``post``: the experts and the rest of
    the block). ``host_s`` is the forward's host time, ``post_host_s`` its part after
    the read-back, ``expert_gemms`` the grouped linears' GEMMs (all after it)."""
    pre = [_part(o, True, rates.fill) for o in ops if o.name not in post]
    after = [_part(o, True, rates.fill) for o in ops if o.name in post]
    return tuple(_steps(pre, max(host_s - post_host_s, 0.0), 0.0, rates, len(pre) - 1)
                 + _steps(after, post_host_s, expert_gemms * rates.grouped_gemm_s,
                          rates, None))


def backward_issue(ops, rates: HostRates, host_s: float, expert_gemms: float,
                   recompute_s: float, recompute_share: float) -> tuple[Step, ...]:
    """A layer's backward: its recomputed forward first (``recompute_s`` device seconds,
    ``recompute_share`` of the forward's launches and ops), then its ops in reverse
    (autograd's order: the MLP block before attention), each op's input and weight
    gradients together. ``expert_gemms``: the grouped linears' GEMMs of the backward
    with those of the recompute."""
    parts = []
    if recompute_s > 0:
        k = recompute_share * sum(max(rates.fill * o.fwd_kernels, 1) for o in ops)
        parts.append((recompute_s, max(k, 1.0), recompute_share * len(ops), False))
    parts += [_part(o, False, rates.fill) for o in reversed(ops)]
    return tuple(_steps(parts, host_s, expert_gemms * rates.grouped_gemm_s, rates, None))
