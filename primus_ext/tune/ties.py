"""What the tuner can resolve: ties between layouts of one job, and the layout it
recommends among the layouts tied with the fastest.

Two candidates are a tie when their difference lies inside the 80 % band of that
difference (project/bands.py ``compare``: each layout's band from held-out residuals of
comparable runs, the two errors correlated by ``rho``, fitted on the validation set's
pairs of layouts of one job). Among the layouts tied with the fastest, the report
recommends the one closest to the published recipe of the job (fewest axes changed),
when one is known, else the simplest (fewest parallel axes above 1); the projected
order breaks what those rules leave equal. Pure: metrics dicts and points only.
"""
from __future__ import annotations

from dataclasses import dataclass

from primus_ext.project import bands
from primus_ext.tune.points import AXES, as_dict

# The parallel axes a layout splits the job along ("simplest": fewest of them above 1).
PARALLEL_AXES = ("tp", "pp", "vpp", "cp", "ep", "etp")


def metrics_features(metrics: dict, is_moe: bool, recompute_inferred: bool = False
                     ) -> dict[str, str]:
    """Band features of a trial's metrics (tune/evaluate.py compact_estimate)."""
    feats = metrics.get("band_features")
    if not feats:  # a journal written before the metrics held them
        from primus_ext.presets import hardware_preset
        feats = {"arch": "moe" if is_moe else "dense",
                 "hardware": bands.hardware_family(hardware_preset(metrics["hardware"])),
                 "scale": bands.scale_bucket(metrics["world_size"])}
    step = metrics["step_time_s"]
    share = metrics["breakdown"].get("host_s", 0.0) / step if step > 0 else 0.0
    return {**feats, "host": bands.host_bucket(share),
            "recompute": "inferred" if recompute_inferred else "published"}


def versus(a: dict, b: dict, is_moe: bool, b_inferred: bool = False,
           table: bands.BandTable | None = None) -> bands.Comparison:
    """Trial metrics ``a`` against ``b`` (tokens/s/GPU): gain, its band, resolvable."""
    return bands.compare(a["tokens_per_s_per_gpu"], metrics_features(a, is_moe),
                         b["tokens_per_s_per_gpu"], metrics_features(b, is_moe, b_inferred),
                         table)


def axes_above_one(point) -> int:
    d = as_dict(point)
    return sum(1 for a in PARALLEL_AXES if (d.get(a) or 1) > 1)


def axes_changed(point, other) -> int:
    da, db = as_dict(point), as_dict(other)
    return sum(1 for a in AXES if da[a] != db[a])


def same_cluster(a: dict, b: dict) -> bool:
    return a["hardware"] == b["hardware"] and a["world_size"] == b["world_size"]


@dataclass(frozen=True, slots=True)
class Recommendation:
    trial: object  # the recommended Trial
    rule: str  # which rule chose it, in words
    tied: tuple  # the trials tied with the fastest (the fastest first)


def recommend(ranked: list, is_moe: bool, reference_point=None, reference_id: str = "",
              table: bands.BandTable | None = None) -> Recommendation | None:
    """Among ``ranked`` (ok trials, best first), the layouts on the fastest one's
    cluster tied with it, and the one to recommend with the rule that chose it."""
    if not ranked:
        return None
    best = ranked[0]
    tied = [best] + [t for t in ranked[1:] if same_cluster(t.metrics, best.metrics)
                     and not versus(best.metrics, t.metrics, is_moe, table=table).resolvable]
    order = {id(t): i for i, t in enumerate(tied)}
    if len(tied) == 1:
        return Recommendation(best, "the fastest layout: no other layout is tied with "
                              "it within the projector's error", tuple(tied))
    if reference_point is not None:
        pick = min(tied, key=lambda t: (axes_changed(t.point, reference_point),
                                        order[id(t)]))
        n = axes_changed(pick.point, reference_point)
        return Recommendation(pick, f"closest to the published recipe {reference_id} "
                              f"({n} setting(s) changed) among the {len(tied)} layouts "
                              "tied with the fastest", tuple(tied))
    pick = min(tied, key=lambda t: (axes_above_one(t.point), order[id(t)]))
    return Recommendation(pick, f"the simplest ({axes_above_one(pick.point)} parallel "
                          f"axes above 1) among the {len(tied)} layouts tied with the "
                          "fastest; no published recipe of this job is known", tuple(tied))
