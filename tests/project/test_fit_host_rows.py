"""A preset's host speed fitted on its own host-bound published rows
(project/fit_host_rows.py), held against AMD Primus' DeepSeek-V2-Lite micro-batch sweep
on 8 MI355X (github.com/AMD-AGI/Primus@3aaf2d5fb41e examples/moe_package/README.md,
Figure 6, baseline bars; P131-P134 and P113 of the public set): 10,735 / 21,028 / 28,063 /
30,360 / 30,444 tokens/s/GPU at MBS 1 / 2 / 4 / 8 / 12. At MBS 1 and 2 the host sets the
step; from MBS 4 on the GPU does."""
from __future__ import annotations

import dataclasses

import pytest

from primus_ext.modes.calibrate import _uncalibrated
from primus_ext.project.calibration import load_calibration
from primus_ext.project.estimate import project
from primus_ext.project.fit import fit
from primus_ext.project.fit_host_rows import META_KEY
from primus_ext.published import read_runs

SWEEP = {"P131": 10734.6, "P132": 21028.2, "P133": 28063.1, "P134": 30359.5,
         "P113": 30444.3}
SOURCE = "AMD-Primus-moe-package-blog"


@pytest.fixture(scope="module")
def runs():
    return {r.run_id: r for r in read_runs()}


def test_one_host_speed_explains_the_whole_sweep(runs):
    calib = load_calibration("default")
    row_fitted = calib.meta[META_KEY]["mi355x"]
    assert row_fitted["host_bound_rows"] >= 2
    # A slower host than the DGX H100 whose fitted speed MI355X inherits.
    assert row_fitted["fitted"] < row_fitted["inherited"]
    assert calib.constants["mi355x"]["host_speed"] == row_fitted["fitted"]
    for run_id, measured in SWEEP.items():
        est = project(runs[run_id].spec, calibration=calib)
        assert est.tokens_per_s_per_gpu == pytest.approx(measured, rel=0.05), run_id
    # The host sets MBS 1, the GPU MBS 8: the crossover is the model's, not the fit's.
    at_1 = project(runs["P131"].spec, calibration=calib)
    assert at_1.breakdown["host_s"] > 0.3 * at_1.step_time_s
    inherited = dataclasses.replace(calib, constants={
        **calib.constants,
        "mi355x": {**calib.constants["mi355x"], "host_speed": row_fitted["inherited"]}})
    fast = project(runs["P131"].spec, calibration=inherited).tokens_per_s_per_gpu
    assert fast / SWEEP["P131"] - 1 > 0.15  # the inherited speed: MBS 1 far too fast
    at_8 = project(runs["P134"].spec, calibration=inherited).tokens_per_s_per_gpu
    assert at_8 == pytest.approx(SWEEP["P134"], rel=0.03)  # the GPU-bound end unmoved


def test_a_held_out_fit_never_sees_the_held_out_sweep(runs):
    """Leave-one-source-out (modes/calibrate.py held_out_results): without the sweep's
    source, MI355X keeps the host speed it inherits; with only the sweep, the fit finds
    the all-source value again."""
    warm = load_calibration("default")
    inherited = warm.meta[META_KEY]["mi355x"]["inherited"]
    mi = [r for r in runs.values() if r.spec and r.spec.cluster.hardware.name == "mi355x"]
    others = [r for r in mi if r.source != SOURCE]
    assert others
    calib = fit(others, _uncalibrated, warm=warm, host_donor=warm).calibration
    assert calib.constants["mi355x"]["host_speed"] == inherited
    assert "mi355x" not in calib.meta[META_KEY]
    sweep = [runs[k] for k in SWEEP]
    calib = fit(sweep, _uncalibrated, warm=warm, host_donor=warm).calibration
    assert calib.constants["mi355x"]["host_speed"] == pytest.approx(
        warm.constants["mi355x"]["host_speed"], rel=0.1)
