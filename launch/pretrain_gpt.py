#!/usr/bin/env python
"""Drop-in for Megatron-LM's ``pretrain_gpt.py`` under torchrun.

    torchrun --nproc-per-node 2 launch/pretrain_gpt.py <Megatron-LM flags> \
        --project-only --target-nodes 8 --target-hardware h100

Accepts Megatron-LM's flags for model shape, parallel layout, batch, precision,
recompute and optimizer, plus --project-only, --target-nodes, --target-gpus-per-node,
--target-hardware, --profile-out, --projection-out, --recipe-out, --timings-out,
--log-layer-times. Flags it does not model (data paths, checkpointing, logging, ...) are
ignored with one warning.
See primus_ext/frameworks/megatron/launch.py.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from primus_ext.frameworks.megatron.launch import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
