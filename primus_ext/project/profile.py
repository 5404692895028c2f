"""Profile: what a measured run produced, saved as JSON with a schema version (pure).

Seconds are per microbatch per layer on one rank (medians over repeats, microbatches and
the layers of a kind; the slowest rank where ranks differ). Collective bytes follow the
comm model's convention (``CommOp.num_bytes``: the full buffer as nccl-tests counts it --
the gathered output of an all-gather, the input of a reduce-scatter, the tensor of an
all-reduce, the local input of an all-to-all, the bytes sent by a p2p).
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field

from primus_ext.spec import RunSpec, padded_vocab
from primus_ext.spec._check import check_types
from primus_ext.util.files import atomic_write_text, input_file

SCHEMA_VERSION = 1


@dataclass(frozen=True, kw_only=True, slots=True)
class CollectiveSeen:
    """One kind of collective issued inside a layer kind, per layer per microbatch."""
    kind: str  # dense | moe | embedding | output | step
    part: str  # attn | mlp | layer (outside the sub-modules) | step
    op: str  # the torch.distributed function
    collective: str  # all_reduce | all_gather | reduce_scatter | all_to_all | p2p
    axis: str  # tp | cp | ep | etp | tp_ep | dp | edp | pp | world
    phase: str  # fwd | bwd | step
    group_size: int
    num_bytes: float  # mean per call, comm-model convention (see module docstring)
    count: float  # calls per layer per microbatch (per step for kind 'step')
    seconds: float  # median per call on the measuring devices
    dtype: str = ""  # payload dtype (activations; fp32 routing weights; int64 counts)
    # Mean per call of the time a rank was blocked in it (the call and its wait(); an
    # async op overlapped with a GEMM blocks for less than ``seconds``), measured on the
    # host clock in the run itself; None where unknown (device-timed runs).
    blocked_s: float | None = None

    def __post_init__(self) -> None:
        check_types(self, "profile.collectives[i]")
        if self.blocked_s is not None and self.blocked_s < 0:
            raise ValueError(f"profile.collectives[i].blocked_s={self.blocked_s!r} must "
                             "be non-negative")


@dataclass(frozen=True, kw_only=True, slots=True)
class KindTiming:
    """Measured times of one layer kind, seconds per layer per microbatch."""
    kind: str
    num_layers: int  # layers of this kind in the measured run
    num_samples: int
    fwd_s: float
    bwd_s: float
    # Sub-module times: {"attn": {"fwd": s, "bwd": s}, "mlp": {...}, "core_attn": ...}
    parts: dict = field(default_factory=dict)
    # Collective seconds included in fwd_s / bwd_s, per axis and phase:
    # {"tp": {"fwd": s, "bwd": s}, ...}; group-size-1 calls are listed under their axis.
    comm_s: dict = field(default_factory=dict)
    # Slowdown of this kind's compute when every core of the node is busy (CPU only):
    # time with busy neighbours / time alone (1.0 on GPUs).
    contention: float = 1.0
    activation_bytes: int | None = None  # saved for backward, per layer per microbatch
    recompute_s: float | None = None  # measured recomputed forward (full recompute)
    per_rank_fwd_s: tuple[float, ...] = ()
    per_rank_bwd_s: tuple[float, ...] = ()
    # MoE kinds: routed tokens per expert, one vector per layer and microbatch of the
    # timed steps, every rank's (measure/routing.py; project/moe_balance.py).
    expert_loads: tuple[tuple[int, ...], ...] = ()

    def __post_init__(self) -> None:
        check_types(self, f"profile.layers.{self.kind}")
        for f in ("num_layers", "num_samples", "fwd_s", "bwd_s", "recompute_s"):
            v = getattr(self, f)
            if v is not None and v < 0:
                raise ValueError(f"profile.layers.{self.kind}.{f}={v!r} must be non-negative")
        if self.contention <= 0:
            raise ValueError(f"profile.layers.{self.kind}.contention={self.contention!r} "
                             "must be positive")


@dataclass(frozen=True, kw_only=True, slots=True)
class CommFit:
    """Alpha-beta fit ``t = alpha_s + num_bytes / (gbps * 1e9)`` of one collective."""
    collective: str
    group_size: int
    alpha_s: float
    gbps: float
    points: tuple[tuple[float, float], ...]  # (num_bytes, median seconds)
    max_rel_err: float

    def __post_init__(self) -> None:
        check_types(self, "profile.comm_fits[i]")

    def seconds(self, num_bytes: float) -> float:
        return self.alpha_s + num_bytes / (self.gbps * 1e9) if num_bytes > 0 else 0.0


def fit_alpha_beta(points: list[tuple[float, float]]) -> tuple[float, float, float]:
    """(alpha_s, gbps, max relative error) of ``t = a + x / (gbps*1e9)`` minimising the
    relative squared error (weights 1/t^2). Alpha and 1/bw are kept non-negative."""
    if not points:
        raise ValueError("no points to fit")
    # Weighted least squares for t = a + b x with weights w = 1/t^2.
    sw = sx = sy = sxx = sxy = 0.0
    for x, t in points:
        w = 1.0 / max(t, 1e-12) ** 2
        sw += w
        sx += w * x
        sy += w * t
        sxx += w * x * x
        sxy += w * x * t
    det = sw * sxx - sx * sx
    if det <= 0:
        a, b = sy / sw, 0.0
    else:
        b = (sw * sxy - sx * sy) / det
        a = (sy - b * sx) / sw
    if b <= 0:  # bandwidth not resolved: latency only
        b = 1e-15
        a = sy / sw
    if a < 0:  # pure bandwidth through the origin
        a = 0.0
        b = sum(t * x / max(t, 1e-12) ** 2 for x, t in points) / sum(
            x * x / max(t, 1e-12) ** 2 for x, t in points)
    err = max(abs(a + b * x - t) / t for x, t in points)
    return a, 1.0 / b / 1e9, err


_STEP_NUMBERS = ("step_s", "zero_grad_s", "fwd_bwd_s", "optimizer_s", "num_microbatches",
                 "num_params_per_rank", "num_expert_params_per_rank")


@dataclass(frozen=True, kw_only=True, slots=True)
class Profile:
    schema_version: int = SCHEMA_VERSION
    created: str
    device: dict  # kind (cpu|cuda), name, hardware preset, count, threads, clock
    versions: dict  # torch, megatron_core, python, primus_ext
    target_overrides: tuple[str, ...]
    downscale_overrides: tuple[str, ...]
    rules: tuple[str, ...]
    measured_shapes: dict  # rank_shapes() of the measured run (what was built)
    measured_parallel: dict  # tp, cp, ep, etp, dp, sequence_parallel, world
    layers: dict  # kind -> KindTiming
    collectives: tuple[CollectiveSeen, ...]
    step: dict  # step_s, fwd_bwd_s, optimizer_s, num_microbatches, num_params, ...
    comm_fits: tuple[CommFit, ...] = ()
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        check_types(self, "profile")
        for k in _STEP_NUMBERS:  # what the projection reads from ``step``
            v = self.step.get(k, 0)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
                    or v < 0:
                raise ValueError(f"profile.step.{k}={v!r} must be a non-negative number")

    # ---- JSON ----------------------------------------------------------------------
    def to_dict(self) -> dict:
        d = asdict(self)
        d["layers"] = {k: asdict(v) for k, v in self.layers.items()}
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Profile":
        v = d.get("schema_version")
        if v != SCHEMA_VERSION:
            raise ValueError(f"profile schema_version={v!r}; this version reads "
                             f"{SCHEMA_VERSION} (re-run mode=measure)")
        d = dict(d)
        d["layers"] = {k: KindTiming(**{
            **x, "per_rank_fwd_s": tuple(x.get("per_rank_fwd_s", ())),
            "per_rank_bwd_s": tuple(x.get("per_rank_bwd_s", ())),
            "expert_loads": tuple(tuple(v) for v in x.get("expert_loads", ()))})
            for k, x in d["layers"].items()}
        d["collectives"] = tuple(CollectiveSeen(**c) for c in d["collectives"])
        d["comm_fits"] = tuple(CommFit(**{**c, "points": tuple(tuple(p) for p in c["points"])})
                               for c in d.get("comm_fits", ()))
        for k in ("target_overrides", "downscale_overrides", "rules", "notes"):
            d[k] = tuple(d.get(k, ()))
        return cls(**d)

    def save(self, path: str | os.PathLike) -> None:
        atomic_write_text(path, json.dumps(self.to_dict(), indent=1, sort_keys=True) + "\n",
                          "profile")

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Profile":
        input_file(path, "profile")
        with open(path) as f:
            try:
                data = json.load(f)
            except json.JSONDecodeError as exc:
                raise ValueError(f"profile {path} is not valid JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise ValueError(f"profile={path}: not a profile (a JSON object); re-run "
                             "mode=measure")
        try:
            return cls.from_dict(data)
        except (TypeError, AttributeError, KeyError) as exc:
            # A hand-edited or foreign file: one line saying what is wrong, not where in
            # from_dict it broke.
            what = (f"missing key {exc}" if isinstance(exc, KeyError) else
                    "a field has the wrong type or name" if isinstance(exc, AttributeError)
                    else str(exc).replace(".__init__()", ""))
            raise ValueError(f"profile={path} is not a valid profile: {what}; re-run "
                             "mode=measure") from None

    # ---- queries -------------------------------------------------------------------
    def fit(self, collective: str, group_size: int) -> CommFit | None:
        best = None
        for f in self.comm_fits:
            if f.collective == collective and f.group_size == group_size:
                return f
            if f.collective == collective and (best is None or f.group_size > best.group_size):
                best = f if f.group_size <= group_size else best
        return best

    def collectives_of(self, kind: str) -> list[CollectiveSeen]:
        return [c for c in self.collectives if c.kind == kind]

    @property
    def hardware(self) -> str:
        return self.device.get("hardware", "")


def rank_shapes(spec: RunSpec) -> dict:
    """What one rank computes per microbatch: the shapes that decide its kernel times."""
    m, p, t = spec.model, spec.parallel, spec.train
    tokens = t.micro_batch_size * t.seq_length // p.cp
    out = {
        "micro_batch_size": t.micro_batch_size, "seq_length": t.seq_length,
        "tokens": tokens, "sp_tokens": tokens // p.tp if p.sequence_parallel else tokens,
        "hidden_size": m.hidden_size, "heads": m.num_attention_heads // p.tp,
        "query_groups": max(m.num_groups // p.tp, 1), "head_dim": m.head_dim,
        "ffn": m.dense_ffn_size // p.tp,
        "vocab": padded_vocab(m.vocab_size, m.make_vocab_size_divisible_by, p.tp) // p.tp,
        "cp": p.cp, "precision": t.precision, "activation": m.activation,
        "normalization": m.normalization, "attention_backend": t.attention_backend,
    }
    if m.is_moe:
        out.update(experts=m.num_moe_experts // p.ep,
                   expert_ffn=m.expert_ffn_size // p.expert_tp,
                   topk=m.moe_router_topk,
                   shared_ffn=(m.moe_shared_expert_intermediate_size or 0) // p.tp)
    return out
