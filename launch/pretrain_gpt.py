#!/usr/bin/env python
"""Drop-in for Megatron-LM's ``pretrain_gpt.py`` under torchrun.

    torchrun --nproc-per-node 2 launch/pretrain_gpt.py <Megatron-LM flags> \
        --project-only --target-nodes 8 --target-hardware h100
    python launch/pretrain_gpt.py <Megatron-LM flags> --project-only \
        --projection-backend simulate --target-nodes 8 --target-hardware h100

Takes a Megatron-LM launch line as it is (the flags it reads:
primus_ext/frameworks/megatron/table.py), plus --project-only, --projection-backend
(hybrid: measure then project, the default; simulate: analytic, no torch),
--target-nodes, --target-gpus-per-node, --target-hardware, --profile-out,
--projection-out, --recipe-out, --timings-out, --log-layer-times. Other flags are
accepted: one line lists those not modelled that may change step time, one those with no
effect on step time or memory.
See primus_ext/frameworks/megatron/launch.py.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from primus_ext.frameworks.megatron.launch import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
