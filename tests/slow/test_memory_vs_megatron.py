"""The memory model against a real megatron-core GPTModel, byte for byte.

Two CPU processes with gloo (``torch.multiprocessing.spawn``, one thread each) run every
case of ``primus_ext/groundtruth/memory_cases.py`` once: parameters per rank, the DDP grad
and param buffers and the optimizer state megatron-core allocates, the activation bytes
autograd saves per layer and for the output layer (GPU-like dropout masks), and the
microbatches alive at a stage's peak in a real PP=2 schedule. Every row must satisfy
``measured - ours == cpu_delta``, where ``cpu_delta`` is a named CPU-vs-GPU difference
of exact size (see ``memory_compare.py``: the composite CPU RMSNorm, LayerNorm statistics
in the input dtype); for everything else the difference is zero bytes.
"""
from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("megatron.core")

from primus_ext.groundtruth.memory_cases import CASES  # noqa: E402
from primus_ext.groundtruth.memory_compare import compare  # noqa: E402
from primus_ext.groundtruth.memory_runner import run_cases  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def measured() -> dict:
    return run_cases(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_case_matches_megatron(case, measured):
    rows = compare(case, measured[case.name])
    assert rows, f"{case.name}: nothing compared"
    bad = [f"{r.quantity} rank {r.rank}: ours {r.ours} measured {r.measured} "
           f"(diff {r.diff}, expected CPU delta {r.cpu_delta} {r.cpu_note})"
           for r in rows if not r.ok]
    assert not bad, f"{case.name}:\n" + "\n".join(bad)


def test_coverage(measured):
    """The brief's matrix: each of these appears in at least one case."""
    kinds = {m for c in CASES for m in c.measure}
    assert kinds == {"params", "buffers", "activations", "inflight"}
    specs = [c.spec for c in CASES]
    assert any(s.parallel.tp == 2 and s.parallel.sequence_parallel for s in specs)
    assert any(s.parallel.tp == 2 and not s.parallel.sequence_parallel for s in specs)
    assert any(s.parallel.vpp == 2 for s in specs)
    assert any(s.parallel.ep == 2 for s in specs)
    assert any(not s.model.untie_embeddings_and_output_weights and s.parallel.pp == 2
               for s in specs)
    assert any(s.model.num_groups != s.model.num_attention_heads for s in specs)
    grans = {s.train.recompute_granularity for s in specs}
    assert grans == {None, "selective", "full"}
    assert {s.train.attention_softmax_in_fp32 for s in specs} == {True, False}
