"""The leave-one-out refits share a memo (project/fit.py ``fit(memo=...)``): a preset
whose rows and start repeat an earlier fit takes that fit's result instead of searching
again. The result must be the one the search gives, and a changed row set must search."""
from __future__ import annotations

from primus_ext.project.calibration import load_calibration
from primus_ext.project.estimate import project
from primus_ext.project.fit import fit
from primus_ext.published import read_runs


def _counting():
    calls = []

    def project_fn(spec):
        calls.append(spec.cluster.hardware.name)
        return project(spec, calibration=None)
    return project_fn, calls


def test_a_repeated_preset_fit_is_taken_from_the_memo_and_equals_the_search():
    runs = read_runs()
    # Two presets, two rows each (MI325X, H100): a few seconds of search.
    mi = [r for r in runs if r.spec and r.spec.cluster.hardware.name == "mi325x"][:2]
    h100 = [r for r in runs if r.spec and r.spec.cluster.hardware.name == "h100"][:2]
    assert len(mi) == 2 and len(h100) == 2
    warm = load_calibration("default")

    fresh_fn, fresh_calls = _counting()
    fresh = fit(mi + h100, fresh_fn, warm=warm).calibration

    memo: dict = {}
    first_fn, _ = _counting()
    fit(mi + h100[:1], first_fn, warm=warm, memo=memo)  # mi300x fitted and memoised
    again_fn, again_calls = _counting()
    again = fit(mi + h100, again_fn, warm=warm, memo=memo).calibration
    assert "mi325x" not in again_calls and "h100" in again_calls  # h100's rows changed
    assert again.constants == fresh.constants
    assert set(fresh_calls) == {"mi325x", "h100"}
