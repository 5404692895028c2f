"""ClusterSpec: a number of nodes of one hardware kind."""
from __future__ import annotations

from dataclasses import dataclass

from primus_ext.spec._check import check_types, non_negative, positive
from primus_ext.spec.hardware import HardwareSpec


@dataclass(frozen=True, kw_only=True, slots=True)
class ClusterSpec:
    hardware: HardwareSpec
    num_nodes: int = 1
    gpus_per_node: int | None = None  # None -> the hardware preset's node size
    gpu_hour_cost: float | None = None  # price of one GPU-hour, for cost objectives

    def __post_init__(self) -> None:
        check_types(self, "cluster")
        positive("cluster", "num_nodes", self.num_nodes)
        if self.gpus_per_node is not None:
            positive("cluster", "gpus_per_node", self.gpus_per_node)
        if self.gpu_hour_cost is not None:
            non_negative("cluster", "gpu_hour_cost", self.gpu_hour_cost)

    @property
    def node_size(self) -> int:
        return self.gpus_per_node or self.hardware.gpus_per_node

    @property
    def world_size(self) -> int:
        return self.num_nodes * self.node_size
