"""Megatron-LM's GPU-measured functional tests (DGX H100 golden values): the drop-in reads
each real launch line and the projection lands near the iteration time Megatron-LM
logged (tests/data/megatron_golden/, docs/accuracy.md's golden section).

The H100 host constants of the committed calibration were fitted on these cases by
``mode=calibrate`` (project/fit.py HOST_FITTED); ``tests/slow/test_loso.py`` checks the
leave-one-family-out figure."""
import pytest

from primus_ext.project.calibration import load_calibration
from primus_ext.project.validate import percentile, project_run
from primus_ext.published.golden import as_runs, read_golden


@pytest.fixture(scope="module")
def errors():
    calib = load_calibration("default")
    out = []
    for r in as_runs(read_golden(timed_only=True)):
        res = project_run(r, calib)
        out.append((r, 1.0 / (1.0 + res.rel_error) - 1.0))
    return out


def test_every_timed_case_is_read_and_projected(errors):
    cases = read_golden(timed_only=True)
    assert len(cases) >= 75
    refused = [c for c in cases if c.spec is None]
    # The two Muon lines: --optimizer muon is not modelled (the launch-line issue).
    assert len(refused) <= 2, [(c.case, c.error) for c in refused]
    assert len(errors) == len(cases) - len(refused)


def test_golden_iteration_time_within_the_bounds(errors):
    errs = [abs(e) for _, e in errors]
    assert percentile(errs, 50) <= 0.15
    assert percentile(errs, 90) <= P90_BOUND


def test_host_bound_cases_are_no_longer_all_too_fast(errors):
    """Without a host clock every case came out too fast (85 % at the median). Now fewer
    than a quarter are more than 15 % fast, the signed median is within 5 % of zero (no
    side dominates), and the slow tail past +15 % stays under a third (a host clock
    that overshot would show there)."""
    fast = sum(1 for _, e in errors if e < -0.15)
    slow = sum(1 for _, e in errors if e > 0.15)
    assert fast < len(errors) / 4
    assert abs(percentile([e for _, e in errors], 50)) <= 0.05
    assert slow < len(errors) / 3


# The target is 30 %; see docs/accuracy.md for the cases past it.
P90_BOUND = 0.35
