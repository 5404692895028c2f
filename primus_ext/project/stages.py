"""Place layer costs on pipeline stages: per (stage, chunk) forward and backward seconds.

A virtual stage's time is the sum of its decoder layers plus its extras: the embedding on
the first virtual stage (stage 0, chunk 0), the output layer with the loss and any MTP
layers on the last (stage pp-1, chunk vpp-1). Exposed in-layer communication is added to
the phase that waits for it. Recompute follows Megatron-LM: selective recompute and
full recompute with the uniform method recompute every layer; the block method
recomputes the first ``recompute_num_layers`` layers of each chunk.
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


def _recomputed(spec: RunSpec, index_in_chunk: int) -> bool:
    t = spec.train
    if t.recompute_granularity == "full" and t.recompute_method == "block":
        return index_in_chunk < (t.recompute_num_layers or 0)
    return t.recompute_granularity is not None


def stage_times(spec: RunSpec, costs: LayerCosts) -> StageTimes:
    layout = spec.layout
    pp, vpp = layout.pp, layout.vpp
    fwd = [[0.0] * vpp for _ in range(pp)]
    bwd_in = [[0.0] * vpp for _ in range(pp)]
    bwd_w = [[0.0] * vpp for _ in range(pp)]
    compute = [0.0] * pp
    recompute = [0.0] * pp
    comm: list[dict[str, float]] = [{} for _ in range(pp)]

    def add(s: int, c: int, lc: LayerCost, recomp: bool) -> None:
        r = lc.recompute_s if recomp else 0.0
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
                add(s, c, costs.decoder_layer(first + i), _recomputed(spec, i))
    if "embedding" in costs.kinds:
        add(0, 0, costs.kinds["embedding"], False)
    if "output" in costs.kinds:
        add(pp - 1, vpp - 1, costs.kinds["output"], False)
    if spec.model.mtp_num_layers and "mtp" in costs.kinds:
        for _ in range(spec.model.mtp_num_layers):
            add(pp - 1, vpp - 1, costs.kinds["mtp"], False)
    freeze = lambda rows: tuple(tuple(r) for r in rows)  # noqa: E731
    return StageTimes(fwd_s=freeze(fwd), bwd_input_s=freeze(bwd_in),
                      bwd_weight_s=freeze(bwd_w), compute_s=tuple(compute),
                      recompute_s=tuple(recompute), comm_s=tuple(comm))
