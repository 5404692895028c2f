"""report.md's claims, limited to what the projector resolves (tune/ties.py): each
comparison says "faster by X% (resolvable)" or "tied within the projector's error", the
top-k table says how each layout stands against the winner, and a section names the
layouts tied with the winner and the one recommended among them, with its rule."""
from __future__ import annotations

from primus_ext.project import bands
from primus_ext.tune.points import describe
from primus_ext.tune.ties import metrics_features, recommend, versus


def band_cell(metrics: dict, is_moe: bool, inferred: bool = False) -> str:
    """'low - high' of a trial's tokens/s/GPU."""
    b = bands.tokens_band(metrics["tokens_per_s_per_gpu"],
                          metrics_features(metrics, is_moe, inferred))
    return f"{b.low:,.0f} - {b.high:,.0f}"


def verdict(a: dict, b: dict, is_moe: bool, b_inferred: bool = False) -> str:
    """'faster by X% (resolvable)' or 'tied within the projector's error', with the
    80 % band of the gain."""
    c = versus(a, b, is_moe, b_inferred)
    return (f"{c.words()} (projected {c.gain:+.1%}; 80% band of the true gain "
            f"{c.low:+.1%} to {c.high:+.1%}, errors of two layouts of one job "
            f"correlated at rho {c.rho:.2f})")


def against_winner(t, best, is_moe: bool) -> str:
    """Top-k cell: this layout against the winner."""
    if t is best:
        return "winner"
    if not (t.metrics["hardware"] == best.metrics["hardware"]
            and t.metrics["world_size"] == best.metrics["world_size"]):
        return "other cluster"
    c = versus(best.metrics, t.metrics, is_moe)
    return f"{-c.gain / (1 + c.gain):+.1%} (resolvable)" if c.resolvable else "tied"


def recommendation_section(r) -> list[str]:
    """The layouts tied with the winner and the one recommended, with the rule."""
    ranked = r.top(10**9)
    if not ranked:
        return []
    is_moe = r.base_spec.model.is_moe
    ref = r.reference or {}
    ref_point = tuple(ref["point"]) if ref.get("same_job") and ref.get("point") else None
    rec = recommend(ranked, is_moe, ref_point, ref.get("run_id", ""))
    L = ["## What the projector can resolve", "",
         "Each layout's projection has an 80% band (measured / projected of held-out "
         "runs like it: `primus_ext/data/bands/default.json`); two layouts of this job "
         "are tied when their difference lies inside the band of that difference.", "",
         f"Recommended: **{describe(rec.trial.point)}** "
         f"({rec.trial.metrics['tokens_per_s_per_gpu']:,.0f} tokens/s/GPU, 80% band "
         f"{band_cell(rec.trial.metrics, is_moe)}). Rule: {rec.rule}."]
    if rec.trial is not ranked[0]:
        L.append(f"The recipe files hold the projected fastest layout "
                 f"({describe(ranked[0].point)}); the recommended one is "
                 f"{verdict(rec.trial.metrics, ranked[0].metrics, is_moe)} against it.")
    if len(rec.tied) > 1:
        L += ["", f"Tied with the fastest ({len(rec.tied)} layouts, the first "
                  f"{min(len(rec.tied), 10)} shown):", ""]
        L += [f"- {describe(t.point)}: {t.metrics['tokens_per_s_per_gpu']:,.0f} "
              f"tokens/s/GPU" for t in rec.tied[:10]]
    L.append("")
    return L
