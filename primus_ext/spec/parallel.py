"""ParallelSpec: parallel degrees, pipeline layout, sharding and overlap switches.

Degrees use Megatron-LM's meaning: ``tp`` tensor, ``pp`` pipeline, ``vpp`` virtual
pipeline chunks per stage (1 = no interleaving), ``cp`` context, ``ep`` expert,
``etp`` expert-tensor (None = same as tp, Megatron's default). The data-parallel size is
derived from the world size in RunSpec.
"""
from __future__ import annotations

from dataclasses import dataclass

from primus_ext.spec._check import non_negative, one_of, positive

_OWNER = "parallel"
SCHEDULES = ("auto", "1f1b", "interleaved", "zb")
AXES = ("tp", "cp", "ep", "dp", "pp")


@dataclass(frozen=True, kw_only=True, slots=True)
class ParallelSpec:
    tp: int = 1
    pp: int = 1
    vpp: int = 1
    cp: int = 1
    ep: int = 1
    etp: int | None = None
    sequence_parallel: bool = False
    use_distributed_optimizer: bool = True
    fsdp: bool = False
    overlap_grad_reduce: bool = True
    overlap_param_gather: bool = True
    tp_comm_overlap: bool = False
    schedule: str = "auto"  # auto: interleaved when vpp > 1, else 1f1b
    order: str = "tp-cp-ep-dp-pp"
    cp_comm_type: str = "p2p"  # p2p (ring of K/V) or a2a (Ulysses-style all-to-all)
    # Uneven pipeline layouts as Megatron-LM expresses them.
    decoder_first_pipeline_num_layers: int | None = None
    decoder_last_pipeline_num_layers: int | None = None
    account_for_embedding_in_pipeline_split: bool = False
    account_for_loss_in_pipeline_split: bool = False
    # Explicit layout: decoder layers per virtual stage, in pipeline order
    # (chunk 0 of stages 0..pp-1, then chunk 1, ...); length pp * vpp.
    pipeline_layout: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        for f in ("tp", "pp", "vpp", "cp", "ep"):
            positive(_OWNER, f, getattr(self, f))
        if self.etp is not None:
            positive(_OWNER, "etp", self.etp)
        one_of(_OWNER, "schedule", self.schedule, SCHEDULES)
        one_of(_OWNER, "cp_comm_type", self.cp_comm_type, ("p2p", "a2a"))
        axes = self.order.split("-")
        if sorted(axes) != sorted(AXES):
            raise ValueError(
                f"parallel.order={self.order!r} must be a permutation of "
                f"{'-'.join(AXES)} joined by '-'")
        if self.sequence_parallel and self.tp == 1:
            raise ValueError("parallel.sequence_parallel=True requires tp > 1 (tp=1)")
        if self.vpp > 1 and self.pp == 1:
            raise ValueError(f"parallel.vpp={self.vpp} requires pp > 1 (pp=1)")
        if self.schedule == "interleaved" and self.vpp == 1:
            raise ValueError("parallel.schedule='interleaved' requires vpp > 1 (vpp=1)")
        if self.schedule == "1f1b" and self.vpp > 1:
            raise ValueError(f"parallel.schedule='1f1b' requires vpp=1 (vpp={self.vpp})")
        if self.fsdp and self.use_distributed_optimizer:
            # FSDP shards parameters, gradients and optimizer state itself.
            object.__setattr__(self, "use_distributed_optimizer", False)
        for f in ("decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers"):
            v = getattr(self, f)
            if v is not None:
                non_negative(_OWNER, f, v)
                if self.pp == 1:
                    raise ValueError(f"parallel.{f}={v} requires pp > 1 (pp=1)")
        if self.pipeline_layout is not None:
            layout = tuple(self.pipeline_layout)
            object.__setattr__(self, "pipeline_layout", layout)
            if len(layout) != self.pp * self.vpp:
                raise ValueError(
                    f"parallel.pipeline_layout has {len(layout)} entries; it must have "
                    f"pp*vpp={self.pp * self.vpp} (layers per virtual stage)")
            for v in layout:
                non_negative(_OWNER, "pipeline_layout[i]", v)

    @property
    def expert_tp(self) -> int:
        return self.tp if self.etp is None else self.etp

    @property
    def resolved_schedule(self) -> str:
        if self.schedule != "auto":
            return self.schedule
        return "interleaved" if self.vpp > 1 else "1f1b"

    @property
    def model_parallel_size(self) -> int:
        return self.tp * self.pp * self.cp
