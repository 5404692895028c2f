"""Dims: the token counts and element widths every activation term is built from."""
from __future__ import annotations

from dataclasses import dataclass

from primus_ext.spec.parallel import ParallelSpec
from primus_ext.spec.train import TrainSpec

Items = dict[str, int]


@dataclass(frozen=True, slots=True)
class Dims:
    b: int  # micro batch size
    s: int  # sequence length on this rank (seq_length / cp)
    n: int  # tokens on this rank
    n_sp: int  # tokens of norm/dropout/residual tensors (n / tp under SP)
    tp: int
    e: int  # bytes per activation element
    flash: bool
    te: bool = False  # Transformer Engine layer stack (train.te resolved)
    fused_softmax: bool = False  # train.masked_softmax_fusion resolved (attn_unfused.py)
    # Bytes of the router's probabilities: ``--moe-router-dtype fp32`` keeps them in fp32
    # from the router through the experts' weighted activation (0: ``e``).
    router_e: int = 0

    @staticmethod
    def of(par: ParallelSpec, train: TrainSpec) -> "Dims":
        s = train.seq_length // par.cp
        n = train.micro_batch_size * s
        return Dims(b=train.micro_batch_size, s=s, n=n,
                    n_sp=n // par.tp if par.sequence_parallel else n, tp=par.tp,
                    e=4 if train.precision == "fp32" else 2,
                    flash=train.attention_backend == "flash", te=bool(train.te),
                    fused_softmax=bool(train.masked_softmax_fusion),
                    router_e=4 if train.moe_router_dtype == "fp32" else 0)
