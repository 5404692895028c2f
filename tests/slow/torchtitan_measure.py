"""Worker for tests/slow/test_torchtitan_hybrid.py: every launched process runs
``run_measurement`` of a tiny llama3 target; rank 0 saves the Profile.

    torchrun --nproc-per-node 2 tests/slow/torchtitan_measure.py OUT "<overrides>"
        <torchtitan flags>
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main() -> None:
    out, overrides, flags = sys.argv[1], sys.argv[2].split(), sys.argv[3:]
    import primus_ext
    from primus_ext.frameworks.torchtitan.measure import TitanMeasureOptions, \
        run_measurement
    spec = primus_ext.compose(overrides)
    opts = TitanMeasureOptions(warmup=1, repeats=2, num_microbatches=2, contention=False)
    profile = run_measurement(spec, ["--module", "llama3", "--config", "llama3_debugmodel",
                                     *flags], opts)
    if os.environ.get("RANK", "0") == "0":
        profile.save(out)


if __name__ == "__main__":
    main()
