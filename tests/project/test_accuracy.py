"""The projector against published, measured training runs (the committed calibration).

Every row of ``primus_ext/data/validation/published_runs.csv`` with a measured figure is
projected with the committed per-hardware calibration (``mode=validate``'s default) and
compared with the published tokens/s/GPU. The acceptance bounds of docs/accuracy.md:
the dense rows within median |error| <= 5 %, 90th percentile <= 12 %, the whole set (MoE
rows included) held at its present 6 % / 17 %, every row projected; with priors only
(no calibration file) median <= 10 %.
"""
from __future__ import annotations

import pytest

from primus_ext.modes.validate import validate
from primus_ext.project.validate import percentile
from primus_ext.published import DEFAULT_PATH


@pytest.fixture(scope="module")
def results():
    return validate(DEFAULT_PATH, "default")


def test_published_runs_within_the_accuracy_bounds(results):
    errs = [abs(r.rel_error) for r in results if r.rel_error is not None]
    unprojected = [r.run_id for r in results if r.estimate is None]
    assert len(errs) >= 130  # every row of the public set
    assert not unprojected, unprojected
    # The fidelity goal, calibrated median <= 5 % and p90 <= 12 %, holds on the dense
    # rows. With the MoE rows in the set it is not met (5.5 % / 16.0 % when they
    # joined: docs/accuracy.md's goals table); the whole set is held at that figure.
    dense = [abs(r.rel_error) for r in results if r.rel_error is not None
             and r.arch == "dense"]
    assert percentile(dense, 50) <= 0.05 and percentile(dense, 90) <= 0.12
    assert percentile(errs, 50) <= 0.06
    assert percentile(errs, 90) <= 0.17


def test_priors_only_within_ten_percent():
    """With no calibration file (calibration=null: the presets' cited priors only) the
    median |error| stays within 10 %: the constants are physics, not a fit."""
    results = validate(DEFAULT_PATH, None)
    errs = [abs(r.rel_error) for r in results if r.rel_error is not None]
    assert len(errs) >= 129
    assert percentile(errs, 50) <= 0.10
    assert percentile(errs, 90) <= 0.25


def test_every_gpu_kind_and_moe_are_covered_and_sane(results):
    # No group of rows is wildly off even where the overall bounds hold.
    by_gpu: dict[str, list[float]] = {}
    for r in results:
        if r.rel_error is not None:
            by_gpu.setdefault(r.gpu, []).append(abs(r.rel_error))
            by_gpu.setdefault(r.arch, []).append(abs(r.rel_error))
    assert {"H100", "B200", "GB200", "moe", "dense"} <= set(by_gpu)
    for group, errs in by_gpu.items():
        assert percentile(errs, 50) <= 0.20, group
