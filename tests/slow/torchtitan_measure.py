"""Worker for tests/slow/test_torchtitan_hybrid.py: every launched process runs
``run_measurement`` of a tiny llama3 target; rank 0 saves the Profile.

    torchrun --nproc-per-node 2 tests/slow/torchtitan_measure.py [--init-first] OUT
        "<overrides>" <torchtitan flags>

``--init-first`` initialises the process group before the measurement, as a drop-in under
torchrun does (the measurement must reuse it and leave it alive).
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main() -> None:
    args = sys.argv[1:]
    init_first = args[0] == "--init-first"
    if init_first:
        args = args[1:]
    out, overrides, flags = args[0], args[1].split(), args[2:]
    if init_first:
        import torch.distributed as dist
        dist.init_process_group("gloo")
    import primus_ext
    from primus_ext.frameworks.torchtitan.measure import TitanMeasureOptions, \
        run_measurement
    spec = primus_ext.compose(overrides)
    opts = TitanMeasureOptions(warmup=1, repeats=2, num_microbatches=2, contention=False)
    profile = run_measurement(spec, ["--module", "llama3", "--config", "llama3_debugmodel",
                                     *flags], opts)
    if os.environ.get("RANK", "0") == "0":
        profile.save(out)
    if init_first:
        import torch.distributed as dist
        assert dist.is_initialized(), "the caller's process group was destroyed"
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
