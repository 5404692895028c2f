"""Routed tokens per expert, as the MoE routers of a measured run chose them.

A forward hook on every MoE layer's ``router`` (megatron-core ``TopKRouter``, which
returns ``(probs, routing_map)``) records ``routing_map.sum(0)``: tokens per expert for
one layer and microbatch. The projector turns these into the load imbalance between the
target's expert-parallel ranks (``primus_ext.project.moe_balance``): a one-process
measurement computes every expert itself and never waits for a busier peer, the target's
ranks do.
"""
from __future__ import annotations

import torch
import torch.distributed as dist


class RoutingRecorder:
    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model  # the bare GPTModel
        self.enabled = False
        self.loads: list[tuple[int, ...]] = []
        self._handles: list = []

    def _hook(self, module, args, output) -> None:
        if not self.enabled or not isinstance(output, (tuple, list)) or len(output) < 2:
            return
        routing_map = output[1]
        if torch.is_tensor(routing_map) and routing_map.dim() == 2:
            self.loads.append(tuple(int(x) for x in routing_map.sum(0).tolist()))

    def attach(self) -> "RoutingRecorder":
        for layer in self.model.decoder.layers:
            router = getattr(getattr(layer, "mlp", None), "router", None)
            if router is not None:
                self._handles.append(router.register_forward_hook(self._hook))
        return self

    def detach(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def gathered(self) -> tuple[tuple[int, ...], ...]:
        """Every rank's records (each rank routes its own tokens)."""
        everyone = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, self.loads)
        return tuple(v for rank in everyone for v in rank)
