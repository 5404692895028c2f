"""Test-wide settings.

Hypothesis runs derandomized (the same examples on every run) with no per-example
deadline: CI on a shared 2-core machine must not flake on timing or on luck. Set
HYPOTHESIS_PROFILE=explore locally to search new examples.
"""
import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True, deadline=None)
settings.register_profile("explore", deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
