"""Pipeline layout: which decoder layers each (stage, virtual chunk) holds.

Megatron-LM places layers in pipeline order: virtual stage ``k = chunk * pp + stage``
holds a contiguous run of layers. Uneven layouts follow Megatron-LM's flags
(``decoder_first/last_pipeline_num_layers``, ``account_for_embedding/loss_in_pipeline_split``)
or an explicit per-virtual-stage list. Where the layers do not divide and nothing is given,
the most balanced layout is chosen: extra layers go to middle stages first, since the first
and last stages already carry the embedding and the output layer with the loss.
"""
from __future__ import annotations

from dataclasses import dataclass

from primus_ext.spec.parallel import ParallelSpec


@dataclass(frozen=True, kw_only=True, slots=True)
class PipelineLayout:
    layers_per_virtual_stage: tuple[int, ...]  # pipeline order, length pp * vpp
    pp: int
    vpp: int
    how: str  # even | first/last | embedding/loss | explicit | balanced

    def num_layers(self, stage: int, chunk: int) -> int:
        return self.layers_per_virtual_stage[chunk * self.pp + stage]

    def first_layer(self, stage: int, chunk: int) -> int:
        k = chunk * self.pp + stage
        return sum(self.layers_per_virtual_stage[:k])

    def stage_num_layers(self, stage: int) -> int:
        return sum(self.num_layers(stage, c) for c in range(self.vpp))

    def describe(self) -> str:
        counts = ",".join(str(n) for n in self.layers_per_virtual_stage)
        return f"{self.how} layout, layers per virtual stage: [{counts}]"


def _balanced(num_layers: int, num_virtual: int) -> tuple[int, ...]:
    base, extra = divmod(num_layers, num_virtual)
    counts = [base] * num_virtual
    # The first virtual stage carries the embedding, the last the output layer and loss:
    # they get the extra layers last.
    order = [k for k in range(num_virtual) if k not in (0, num_virtual - 1)]
    order += [0, num_virtual - 1] if num_virtual > 1 else [0]
    for k in sorted(order[:extra]):
        counts[k] += 1
    return tuple(counts)


def pipeline_layout(num_layers: int, par: ParallelSpec) -> PipelineLayout:
    pp, vpp = par.pp, par.vpp
    nv = pp * vpp
    if par.pipeline_layout is not None:
        total = sum(par.pipeline_layout)
        if total != num_layers:
            raise ValueError(
                f"parallel.pipeline_layout sums to {total} layers; model.num_layers="
                f"{num_layers} (the layout must place every decoder layer once)")
        return PipelineLayout(layers_per_virtual_stage=par.pipeline_layout, pp=pp,
                              vpp=vpp, how="explicit")
    first, last = par.decoder_first_pipeline_num_layers, par.decoder_last_pipeline_num_layers
    if first is not None or last is not None:
        return _first_last(num_layers, par, first, last)
    if par.account_for_embedding_in_pipeline_split or par.account_for_loss_in_pipeline_split:
        emb = int(par.account_for_embedding_in_pipeline_split)
        loss = int(par.account_for_loss_in_pipeline_split)
        total = num_layers + emb + loss
        if total % nv != 0:
            raise ValueError(
                f"parallel: num_layers={num_layers} plus embedding ({emb}) and loss ({loss}) "
                f"= {total} is not divisible by pp*vpp={nv} "
                "(account_for_embedding/loss_in_pipeline_split)")
        per = total // nv
        counts = [per] * nv
        counts[0] -= emb
        counts[-1] -= loss
        return PipelineLayout(layers_per_virtual_stage=tuple(counts), pp=pp, vpp=vpp,
                              how="embedding/loss")
    if num_layers % nv == 0:
        return PipelineLayout(layers_per_virtual_stage=(num_layers // nv,) * nv, pp=pp,
                              vpp=vpp, how="even")
    if num_layers < nv:
        raise ValueError(
            f"parallel: num_layers={num_layers} is smaller than pp*vpp={nv}; "
            "every virtual stage needs at least one layer")
    return PipelineLayout(layers_per_virtual_stage=_balanced(num_layers, nv), pp=pp,
                          vpp=vpp, how="balanced")


def _first_last(num_layers: int, par: ParallelSpec, first: int | None,
                last: int | None) -> PipelineLayout:
    pp, vpp = par.pp, par.vpp
    rest_stages = pp - (first is not None) - (last is not None)
    rest_layers = num_layers - (first or 0) - (last or 0)
    if rest_layers < 0 or (rest_stages == 0 and rest_layers != 0):
        raise ValueError(
            f"parallel: decoder_first_pipeline_num_layers={first} and "
            f"decoder_last_pipeline_num_layers={last} do not fit num_layers={num_layers} "
            f"over pp={pp}")
    if rest_stages and rest_layers % (rest_stages * vpp) != 0:
        raise ValueError(
            f"parallel: the {rest_layers} layers left after decoder_first/last_pipeline_"
            f"num_layers are not divisible by the {rest_stages} middle stages * vpp={vpp}")
    middle = rest_layers // (rest_stages * vpp) if rest_stages else 0
    per_stage = [middle * vpp] * pp
    if first is not None:
        per_stage[0] = first
    if last is not None:
        per_stage[-1] = last
    counts = [0] * (pp * vpp)
    for s, n in enumerate(per_stage):
        if n % vpp != 0:
            raise ValueError(
                f"parallel: stage {s} holds {n} layers, not divisible by vpp={vpp}")
        for c in range(vpp):
            counts[c * pp + s] = n // vpp
    return PipelineLayout(layers_per_virtual_stage=tuple(counts), pp=pp, vpp=vpp,
                          how="first/last")
