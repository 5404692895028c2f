"""Worker for tests/slow/test_torchtitan_hooks.py: one process builds torchtitan's Trainer
of a tiny llama3 with the given activation-checkpoint mode, times two steps with the
block hooks, and prints the (scope, phase) samples per step as JSON.

    python tests/slow/torchtitan_hooks_worker.py none|selective|full
"""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main(mode: str) -> None:
    import torch  # noqa: F401 - before the patches
    from patches.torchtitan_apply import apply_torchtitan_cpu_patches
    apply_torchtitan_cpu_patches()
    from primus_ext.frameworks.torchtitan import build
    from primus_ext.frameworks.torchtitan.hooks import TitanTimer
    from primus_ext.frameworks.torchtitan.step import StepRunner
    build.single_process_env()
    dims = build.ModelDims(num_layers=2, hidden_size=64, num_attention_heads=4,
                           num_query_groups=2, ffn_hidden_size=128, vocab_size=256)
    tmp = tempfile.mkdtemp()
    build.ensure_assets(tmp, dims.vocab_size)
    argv = ["--module", "llama3", "--config", "llama3_debugmodel", "--training.seq_len",
            "64", "--training.local_batch_size", "1", "--training.global_batch_size", "2",
            "--training.steps", "4", "--dump_folder", tmp + "/d", "--metrics.log_freq",
            "1000000", *build.asset_flags(tmp), f"activation-checkpoint:{mode}"]
    trainer = build.build_trainer(build.trainer_config(argv, dims))
    timer = TitanTimer(trainer.model_parts[0]).attach()
    runner = StepRunner(trainer, timer)
    runner.step()  # warm-up, untimed
    timer.enabled = True
    runner.step()
    runner.step()
    out = {f"{scope}|{phase}": [len(xs) for xs in steps]
           for (scope, phase), steps in timer.per_step.items()}
    build.teardown(trainer)
    print("RESULT " + json.dumps(out, sort_keys=True))


if __name__ == "__main__":
    main(sys.argv[1])
