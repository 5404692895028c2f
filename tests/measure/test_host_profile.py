"""The committed reference host profile against megatron-core itself.

``primus_ext/data/host/reference.json`` was measured by scripts/host_profile.py on a
real megatron-core model. Its seconds are the reference host's, but the aten ops each
scope dispatches are exact: a fresh count on the installed megatron-core must give the
same kernels per scope (a megatron-core or torch upgrade that changes them means the
profile must be measured again)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from primus_ext.compute.host import reference_profile

ROOT = Path(__file__).resolve().parents[2]
_COUNT = r"""
import json, sys
sys.path.insert(0, {root!r})
from primus_ext.frameworks.megatron.build import init_distributed, prepare_runtime
prepare_runtime(1)
init_distributed()
from primus_ext.measure import host_profile as hp
hp.gpu_like_optimizer()
print(json.dumps(hp.count_ops(hp.variant_spec({name!r}, hp.DEPTHS[0]))))
"""


@pytest.mark.parametrize("name", ["gpt", "moe4"])
def test_profile_kernel_counts_are_megatron_cores(name):
    run = subprocess.run([sys.executable, "-c", _COUNT.format(root=str(ROOT), name=name)],
                         capture_output=True, text=True, timeout=300,
                         env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})
    assert run.returncode == 0, run.stderr[-2000:]
    fresh = json.loads(run.stdout.strip().splitlines()[-1])
    committed = reference_profile()["variants"][name]["ops_per_microbatch"]
    kernels = lambda d: {k: v.get("kernels", 0) for k, v in d.items()}  # noqa: E731
    assert kernels(fresh) == kernels(committed)


def test_profile_describes_its_reference_host():
    p = reference_profile()
    host = p["reference_host"]
    assert host["megatron_core"] and host["torch"] and host["cpu"]
    for v in p["variants"].values():
        assert v["layer_s"] > 0
        assert 0 < v["blocks_s"]["attn|fwd"] < v["blocks_s"]["layer|fwd"]
