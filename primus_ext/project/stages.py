"""Place layer costs on pipeline stages: per (stage, chunk) forward and backward seconds.

A virtual stage's time is the sum of its decoder layers plus its extras: the embedding on
the first virtual stage (stage 0, chunk 0), the output layer with the loss and any MTP
layers on the last (stage pp-1, chunk vpp-1). Exposed in-layer communication is added to
the phase that waits for it. Recompute is in the layer costs: the backend gives the
layers that full recompute selects a kind of their own whose ``recompute_s`` is the whole
forward, and selective recompute is in every decoder kind's ``recompute_s``.
"""
from __future__ import annotations

from dataclasses import dataclass

from primus_ext.project.costs import LayerCost, LayerCosts
from primus_ext.spec import RunSpec


@dataclass(frozen=True, kw_only=True, slots=True)
class StageTimes:
    """[stage][chunk] seconds per microbatch, and what they are made of."""
    fwd_s: tuple[tuple[float, ...], ...]
    bwd_input_s: tuple[tuple[float, ...], ...]
    bwd_weight_s: tuple[tuple[float, ...], ...]
    # Per stage, summed over its chunks, per microbatch: compute, recompute, and exposed
    # communication per axis.
    compute_s: tuple[float, ...]
    recompute_s: tuple[float, ...]
    comm_s: tuple[dict[str, float], ...]


def stage_times(spec: RunSpec, costs: LayerCosts) -> StageTimes:
    layout = spec.layout
    pp, vpp = layout.pp, layout.vpp
    fwd = [[0.0] * vpp for _ in range(pp)]
    bwd_in = [[0.0] * vpp for _ in range(pp)]
    bwd_w = [[0.0] * vpp for _ in range(pp)]
    compute = [0.0] * pp
    recompute = [0.0] * pp
    comm: list[dict[str, float]] = [{} for _ in range(pp)]

    def add(s: int, c: int, lc: LayerCost) -> None:
        r = lc.recompute_s
        fwd[s][c] += lc.fwd_total_s
        bwd_in[s][c] += lc.bwd_input_s + r + lc.bwd_comm_s
        bwd_w[s][c] += lc.bwd_weight_s
        compute[s] += lc.fwd_s + lc.bwd_input_s + lc.bwd_weight_s
        recompute[s] += r
        for axis, x in lc.exposed_comm_by_axis().items():
            comm[s][axis] = comm[s].get(axis, 0.0) + x

    for s in range(pp):
        for c in range(vpp):
            first = layout.first_layer(s, c)
            for i in range(layout.num_layers(s, c)):
                add(s, c, costs.decoder_layer(first + i))
    if "embedding" in costs.kinds:
        add(0, 0, costs.kinds["embedding"])
    if "output" in costs.kinds:
        add(pp - 1, vpp - 1, costs.kinds["output"])
    if spec.model.mtp_num_layers and "mtp" in costs.kinds:
        add(pp - 1, vpp - 1, costs.kinds["mtp"])  # the entry covers every MTP layer
    freeze = lambda rows: tuple(tuple(r) for r in rows)  # noqa: E731
    return StageTimes(fwd_s=freeze(fwd), bwd_input_s=freeze(bwd_in),
                      bwd_weight_s=freeze(bwd_w), compute_s=tuple(compute),
                      recompute_s=tuple(recompute), comm_s=tuple(comm))
