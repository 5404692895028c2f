#!/usr/bin/env python
"""Drop-in for ``-m torchtitan.train`` under torchrun.

    torchrun --nproc-per-node 2 launch/torchtitan_train.py --module llama3 \
        --config llama3_8b --parallelism.tensor_parallel_degree 2 \
        --project-only --target-nodes 8 --target-hardware h100 activation-checkpoint:full

Accepts torchtitan's own command line (--module, --config, --parallelism.*,
--training.*, --compile.*, the trailing activation-checkpoint:{none,selective,full}
subcommand) plus --project-only, --projection-backend simulate|hybrid, --target-nodes,
--target-gpus-per-node, --target-hardware, --projection-out. Flags that change nothing
the projection models are listed in one line; see
primus_ext/frameworks/torchtitan/launch.py and flags.py.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from primus_ext.frameworks.torchtitan.launch import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
