"""LayerCosts: what a cost backend (simulate or a measured profile) hands the projector.

Seconds are per microbatch on one rank. Compute and communication are kept apart so the
projector can apply the overlap rules and report exposed communication per axis.
"""
from __future__ import annotations

from dataclasses import dataclass

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "p2p")
AXES = ("tp", "cp", "ep", "etp", "dp", "edp", "pp")
PHASES = ("fwd", "bwd")
# Layer kinds the projector knows; a model uses a subset.
KINDS = ("dense", "moe", "embedding", "output", "mtp")


@dataclass(frozen=True, kw_only=True, slots=True)
class CommOp:
    """One collective issued inside a layer for one microbatch."""
    name: str  # e.g. "attn.tp_all_gather"
    axis: str  # one of AXES
    collective: str  # one of COLLECTIVES
    num_bytes: int  # bytes each rank contributes (the full message, as torch sees it)
    group_size: int
    phase: str  # fwd | bwd
    seconds: float  # cost of the collective alone
    exposed_s: float  # what remains on the critical path after the overlap rule
    calls: int = 1  # equal calls the op stands for (num_bytes and seconds are their sum)


@dataclass(frozen=True, kw_only=True, slots=True)
class LayerCost:
    """Cost of one layer of a kind, per microbatch, on one rank."""
    kind: str
    fwd_s: float  # forward compute
    bwd_input_s: float  # backward: gradient w.r.t. inputs (dgrad) and non-GEMM backward
    bwd_weight_s: float  # backward: weight gradients (wgrad)
    recompute_s: float = 0.0  # forward work recomputed during backward (recompute setting)
    comms: tuple[CommOp, ...] = ()
    fwd_flops: float = 0.0  # executed FLOPs (not the Megatron model-FLOP count)
    bwd_flops: float = 0.0
    # The host clock (compute/host.py): seconds the node's CPU takes to issue the
    # forward, and the backward with its recompute; host-device synchronisations in each.
    fwd_host_s: float = 0.0
    bwd_host_s: float = 0.0
    fwd_syncs: int = 0
    bwd_syncs: int = 0
    # The forward's part issued after its synchronisation (an MoE layer's token-count
    # read-back before the dispatch: the all-to-alls, the experts, the combine): device
    # seconds (with its exposed collectives) and host seconds; zero when the layer has no
    # synchronisation or is not split (project/stages.py runs the two clocks over it).
    fwd_post_sync_s: float = 0.0
    fwd_post_sync_host_s: float = 0.0
    # The same forward op by op in issue order, where the backend knows it: (host
    # seconds, device seconds, kernels, synchronises after) per step, its sums the
    # figures above (compute/issue.py); empty: the two blocks.
    fwd_issue: tuple[tuple[float, float, float, bool], ...] = ()
    # The backward (with its recompute) the same way, where the forward has it.
    bwd_issue: tuple[tuple[float, float, float, bool], ...] = ()

    @property
    def fwd_comm_s(self) -> float:
        return sum(c.exposed_s for c in self.comms if c.phase == "fwd")

    @property
    def bwd_comm_s(self) -> float:
        return sum(c.exposed_s for c in self.comms if c.phase == "bwd")

    @property
    def fwd_total_s(self) -> float:
        return self.fwd_s + self.fwd_comm_s

    @property
    def bwd_total_s(self) -> float:
        return self.bwd_input_s + self.bwd_weight_s + self.recompute_s + self.bwd_comm_s

    def exposed_comm_by_axis(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for c in self.comms:
            out[c.axis] = out.get(c.axis, 0.0) + c.exposed_s
        return out


@dataclass(frozen=True, kw_only=True, slots=True)
class LayerCosts:
    """Per-kind layer costs plus the kind of every decoder layer, in order.

    ``decoder_kinds[i]`` names the entry of ``kinds`` that decoder layer i uses (several
    layers share an entry: all dense layers of a model cost the same).
    """
    kinds: dict[str, LayerCost]
    decoder_kinds: tuple[str, ...]
    source: str  # "simulate" or "profile:<path>"
    notes: tuple[str, ...] = ()

    def decoder_layer(self, index: int) -> LayerCost:
        return self.kinds[self.decoder_kinds[index]]
