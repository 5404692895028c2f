"""Error bands: how far to trust a projection, from the projector's own held-out errors.

A band is the 10th-90th percentile range (80 % coverage) of measured / projected
tokens/s/GPU over comparable runs the projector was never fitted on: the
leave-one-source-out residuals of the public validation set, the leave-one-family-out
residuals of Megatron-LM's golden values (``scripts/band_data.py`` computes them and writes ``data/bands/default.json``).

Runs are compared by what predicts the error (``FEATURES``): dense or MoE, hardware
family, scale (GPU count bucket), host-bound share of the projected step (breakdown
``host_s`` over the step) and whether the recompute setting was published or inferred.
A band comes from the most specific group of the run's features holding at least
``min_rows`` residuals from ``MIN_SOURCES`` sources; features are dropped one at a time (the band file names the
order: the feature that narrows the bands least goes first) down to all rows.

Quantiles are the predictive ones of one more draw (the Weibull plotting position
q * (n + 1), clamped to the sample's range), so a small group gives a wider band, not a
falsely narrow one.

Step time is the reciprocal of tokens/s/GPU at a fixed global batch, so its band is
the reciprocal ratios. Everything here is pure and cheap: a band is a few dictionary
look-ups, made only where a band is shown (never inside the tuner's scoring loop).

The comparison of two layouts of one job (``compare``) uses the band of their
difference: log errors of two layouts of one job are correlated (``rho``, estimated by
the band script from the validation set's pairs of layouts of one job), so the band of
log(a / b) has half-width sqrt(h_a^2 + h_b^2 - 2 rho h_a h_b) around the difference of
the two bands' centres. A difference inside it is a tie.

API: ``Estimate.error_band(recompute_inferred=False)`` (= ``estimate_bands(est)``) gives
the JSON band of a projection; ``tokens_band`` / ``step_band`` the band of one figure
given its features (``features_of(spec, est)``); ``compare(a, feats_a, b, feats_b)``
decides tie or resolvable between two layouts of one job (tune/ties.py ``versus`` does
it on the tuner's metrics). Cost: ``spec_features`` about 2 us per projection (stored in
the Estimate), a band about 30 us, only where one is shown.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

DEFAULT_PATH = Path(__file__).resolve().parent.parent / "data" / "bands" / "default.json"
SCHEMA_VERSION = 1
COVERAGE = 0.80
LOW_Q, HIGH_Q = 0.10, 0.90
# A group needs this many residuals from at least MIN_SOURCES sources (a golden
# family counts as one: they are held out one family at a time): one source's rows
# share its own bias. Leave-one-source-out on
# the public set: 8 rows cover 77 % at a median half-width of 15 %, 12 rows 81 % at 15 %.
MIN_ROWS = 12
MIN_SOURCES = 2
FEATURES = ("arch", "hardware", "scale", "host", "recompute")
# GPU-count buckets (upper bounds): one node, a few nodes, a pod, beyond.
SCALE_EDGES = ((8, "1-8"), (64, "9-64"), (512, "65-512"))
# Host-bound share of the projected step: above it the host's clock sets the step.
HOST_BOUND_SHARE = 0.10


def hardware_family(hw) -> str:
    """A GPU generation from a HardwareSpec's datasheet traits (not its name): AMD
    Instinct; NVIDIA without FP8 (Ampere), with FP8 whose non-TN GEMMs run natively
    (Blackwell), or not (Hopper, Ada)."""
    vendor = (getattr(hw, "vendor", "") or "").lower()
    if vendor == "amd":
        return "amd"
    if vendor != "nvidia":
        return "other"
    if not getattr(hw, "fp8_tflops", None):
        return "ampere"
    return "blackwell" if getattr(hw, "fp8_non_tn_gemm", False) else "hopper"


def scale_bucket(num_gpus: int) -> str:
    for edge, name in SCALE_EDGES:
        if num_gpus <= edge:
            return name
    return f">{SCALE_EDGES[-1][0]}"


def host_bucket(host_share: float) -> str:
    return "host-bound" if host_share >= HOST_BOUND_SHARE else "device-bound"


def spec_features(spec) -> dict[str, str]:
    """The features a RunSpec alone decides (the projector stores them in its Estimate:
    ``Estimate.band_features``)."""
    return {"arch": "moe" if spec.model.is_moe else "dense",
            "hardware": hardware_family(spec.cluster.hardware),
            "scale": scale_bucket(spec.world_size)}


def host_share(est) -> float:
    step = est.step_time_s
    return est.breakdown.get("host_s", 0.0) / step if step > 0 else 0.0


def estimate_features(est, recompute_inferred: bool = False) -> dict[str, str]:
    """Every grouping feature of a projection: its spec's, its host-bound share and
    whether its recompute setting was published (stated) or inferred."""
    return {**est.band_features, "host": host_bucket(host_share(est)),
            "recompute": "inferred" if recompute_inferred else "published"}


def features_of(spec, est, recompute_inferred: bool = False) -> dict[str, str]:
    """Features of a projected RunSpec (``est``: its Estimate)."""
    return {**spec_features(spec), "host": host_bucket(host_share(est)),
            "recompute": "inferred" if recompute_inferred else "published"}


def group_key(feats: dict[str, str], kept: tuple[str, ...]) -> str:
    """'arch=moe,hardware=hopper' (features in FEATURES order); 'all' when none kept."""
    parts = [f"{f}={feats[f]}" for f in FEATURES if f in kept]
    return ",".join(parts) if parts else "all"


def levels(drop_order: tuple[str, ...]) -> list[tuple[str, ...]]:
    """The kept-feature sets from most to least specific: all features, then one more
    of ``drop_order`` dropped at each level, down to none."""
    kept, out = list(FEATURES), [tuple(FEATURES)]
    for f in drop_order:
        kept.remove(f)
        out.append(tuple(kept))
    return out


def predictive_quantile(values: list[float], q: float) -> float:
    """The q-quantile of one more draw: Weibull position q * (n + 1), clamped."""
    xs = sorted(values)
    n = len(xs)
    pos = min(max(q * (n + 1), 1.0), float(n)) - 1.0
    lo = math.floor(pos)
    hi = min(lo + 1, n - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def build_groups(rows: list[dict], drop_order: tuple[str, ...],
                 min_rows: int = MIN_ROWS, min_sources: int = MIN_SOURCES
                 ) -> dict[str, dict]:
    """Every group (at every level) with at least ``min_rows`` residuals from
    ``min_sources`` sources: its low / high quantiles of the ratio measured / projected
    and its row count. ``rows``: dicts with the FEATURES keys, ``ratio`` and
    ``source``."""
    groups: dict[str, dict] = {}
    for kept in levels(drop_order):
        members: dict[str, list[float]] = {}
        sources: dict[str, set] = {}
        for r in rows:
            key = group_key(r, kept)
            members.setdefault(key, []).append(r["ratio"])
            sources.setdefault(key, set()).add(r.get("source", ""))
        for key, ratios in members.items():
            if (len(ratios) >= min_rows and len(sources[key]) >= min_sources) \
                    or key == "all":
                groups[key] = {"low": predictive_quantile(ratios, LOW_Q),
                               "high": predictive_quantile(ratios, HIGH_Q),
                               "rows": len(ratios)}
    return groups


@dataclass(frozen=True, slots=True)
class BandTable:
    groups: dict  # group key -> {"low", "high", "rows"} (ratios measured / projected)
    drop_order: tuple[str, ...]
    rho: float  # correlation of the log errors of two layouts of one job
    coverage: float = COVERAGE

    def lookup(self, feats: dict[str, str]) -> tuple[str, dict]:
        """(group key, group) of the most specific group holding these features."""
        for kept in levels(self.drop_order):
            key = group_key(feats, kept)
            hit = self.groups.get(key)
            if hit is not None:
                return key, hit
        raise ValueError("band table has no 'all' group")


@dataclass(frozen=True, slots=True)
class ErrorBand:
    low: float
    high: float
    coverage: float
    basis: str  # which residuals: the group key and its row count

    def to_dict(self) -> dict:
        return {"low": self.low, "high": self.high, "coverage": self.coverage,
                "basis": self.basis}

    def contains(self, value: float) -> bool:
        return self.low <= value <= self.high


def table_from_dict(data: dict) -> BandTable:
    if data.get("schema_version") != SCHEMA_VERSION:
        raise ValueError(f"band file schema_version={data.get('schema_version')!r}; "
                         f"this version reads {SCHEMA_VERSION}")
    return BandTable(groups=data["groups"], drop_order=tuple(data["drop_order"]),
                     rho=float(data["rho"]), coverage=float(data.get("coverage", COVERAGE)))


@lru_cache(maxsize=4)
def load_bands(path: str | None = None) -> BandTable:
    """The band table of ``path`` (default: the committed data/bands/default.json)."""
    p = Path(path) if path else DEFAULT_PATH
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError:
        raise ValueError(f"bands={str(p)!r}: no such band file (scripts/band_data.py "
                         "--write makes the default one)") from None
    return table_from_dict(data)


def ratio_band(feats: dict[str, str], table: BandTable | None = None
               ) -> tuple[float, float, str]:
    """(low, high, basis): the band of measured / projected tokens/s/GPU."""
    t = table or load_bands()
    key, g = t.lookup(feats)
    return g["low"], g["high"], f"{key} ({g['rows']} held-out rows)"


def tokens_band(value: float, feats: dict[str, str], table: BandTable | None = None
                ) -> ErrorBand:
    """The band of a projected tokens/s/GPU (or any throughput)."""
    lo, hi, basis = ratio_band(feats, table)
    t = table or load_bands()
    return ErrorBand(low=value * lo, high=value * hi, coverage=t.coverage, basis=basis)


def step_band(value: float, feats: dict[str, str], table: BandTable | None = None
              ) -> ErrorBand:
    """The band of a projected step time (the reciprocal ratios)."""
    lo, hi, basis = ratio_band(feats, table)
    t = table or load_bands()
    return ErrorBand(low=value / hi, high=value / lo, coverage=t.coverage, basis=basis)


def estimate_bands(est, recompute_inferred: bool = False,
                   table: BandTable | None = None) -> dict[str, dict]:
    """The projection JSON's ``error_band``: tokens/s/GPU and step time."""
    feats = estimate_features(est, recompute_inferred)
    return {"tokens_per_s_per_gpu": tokens_band(est.tokens_per_s_per_gpu, feats,
                                                table).to_dict(),
            "step_time_s": step_band(est.step_time_s, feats, table).to_dict()}


@dataclass(frozen=True, slots=True)
class Comparison:
    gain: float  # projected a / b - 1 (throughputs)
    low: float  # 80 % band of the true a / b - 1
    high: float
    resolvable: bool  # the band excludes 0 (no tie)
    rho: float

    def words(self) -> str:
        if not self.resolvable:
            return "tied within the projector's error"
        side = "faster" if self.gain > 0 else "slower"
        return f"{side} by {abs(self.gain):.1%} (resolvable)"


def compare(a: float, feats_a: dict[str, str], b: float, feats_b: dict[str, str],
            table: BandTable | None = None, rho: float | None = None) -> Comparison:
    """Is throughput ``a`` resolvably different from ``b`` (two layouts of one job)?
    The band of log(true a / true b) is log(a / b) plus the difference of the two bands'
    log centres, with half-width sqrt(h_a^2 + h_b^2 - 2 rho h_a h_b) (h: each band's log
    half-width); the two are a tie when it holds 0."""
    t = table or load_bands()
    r = t.rho if rho is None else rho
    la, ha, _ = ratio_band(feats_a, t)
    lb, hb, _ = ratio_band(feats_b, t)
    ca, wa = (math.log(la) + math.log(ha)) / 2, (math.log(ha) - math.log(la)) / 2
    cb, wb = (math.log(lb) + math.log(hb)) / 2, (math.log(hb) - math.log(lb)) / 2
    centre = math.log(a / b) + ca - cb
    half = math.sqrt(max(wa * wa + wb * wb - 2 * r * wa * wb, 0.0))
    low, high = math.exp(centre - half) - 1, math.exp(centre + half) - 1
    return Comparison(gain=a / b - 1, low=low, high=high,
                      resolvable=low > 0 or high < 0, rho=r)
