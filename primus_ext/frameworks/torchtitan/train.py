"""torchtitan's own training entry (``torchtitan.train.main``) with the CPU patches.

    torchrun --nproc-per-node 2 -m primus_ext.frameworks.torchtitan.train \\
        --module llama3 --config llama3_debugmodel [torchtitan flags] \\
        [--model-dims JSON] [--assets DIR] [--timings-out FILE]

``--model-dims`` replaces the registry model by a llama3 of those dims (build.ModelDims);
``--assets DIR`` writes a local tokenizer and dataset there and points the job at them;
``--timings-out`` saves each step's wall time (rank 0, JSON). Everything else is
torchtitan's command line, trained by torchtitan's Trainer unchanged.
"""
from __future__ import annotations

import json
import sys
import time


def _pop(argv: list[str], flag: str) -> str | None:
    for i, a in enumerate(argv):
        if a == flag:
            if i + 1 >= len(argv):
                raise SystemExit(f"{flag} needs a value")
            value = argv[i + 1]
            del argv[i:i + 2]
            return value
        if a.startswith(flag + "="):
            del argv[i]
            return a.split("=", 1)[1]
    return None


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    dims_json, assets, timings_out = (_pop(argv, "--model-dims"), _pop(argv, "--assets"),
                                      _pop(argv, "--timings-out"))
    import torch  # noqa: F401 - before the patches
    from patches.torchtitan_apply import apply_torchtitan_cpu_patches
    apply_torchtitan_cpu_patches()
    from primus_ext.frameworks.torchtitan import build
    from primus_ext.util.files import atomic_write_text
    from torchtitan.tools.logging import init_logger
    init_logger()
    dims = build.ModelDims.from_json(dims_json) if dims_json else None
    if assets:
        build.ensure_assets(assets, dims.vocab_size if dims else 2048)
        cut = next((i for i, a in enumerate(argv) if a.startswith("activation-checkpoint:")),
                   len(argv))
        argv = argv[:cut] + build.asset_flags(assets) + argv[cut:]
    config = build.trainer_config(argv, dims)
    trainer = build.build_trainer(config)
    times: list[float] = []
    original = trainer.train_step

    def timed(data_iterator):
        t0 = time.perf_counter()
        original(data_iterator)
        times.append(time.perf_counter() - t0)

    trainer.train_step = timed
    try:
        trainer.train()
    finally:
        import torch.distributed as dist
        rank = dist.get_rank() if dist.is_initialized() else 0
        build.teardown(trainer)
    if timings_out and rank == 0:
        atomic_write_text(timings_out, json.dumps({"steps_s": times}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
