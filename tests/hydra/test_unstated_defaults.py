"""A config that leaves a recipe setting unstated gets what current performance recipes
do (Megatron-Bridge perf_recipes), says so, and a stated value always wins."""
from primus_ext.config import compose_cfg, spec_and_notes


def _spec(*overrides):
    return spec_and_notes(compose_cfg(list(overrides)))


def test_unstated_follow_the_recipes_with_a_note():
    spec, notes = _spec("model=llama3.1_70b", "cluster.hardware=h100", "cluster.num_nodes=8",
                        "parallel.tp=4", "parallel.pp=4")
    assert spec.parallel.grad_reduce_in_fp32 is False
    assert spec.parallel.sequence_parallel and spec.parallel.tp_comm_overlap is True
    text = " ".join(notes)
    assert "perf_recipes/_common.py" in text and "parallel.tp_comm_overlap" in text


def test_stated_values_win_and_need_no_note():
    spec, notes = _spec("model=llama3.1_70b", "cluster.hardware=h100", "cluster.num_nodes=8",
                        "parallel.tp=4", "parallel.pp=4", "parallel.tp_comm_overlap=false",
                        "parallel.grad_reduce_in_fp32=true")
    assert spec.parallel.tp_comm_overlap is False and spec.parallel.grad_reduce_in_fp32
    assert notes == []


def test_no_tp_overlap_without_te_or_sequence_parallel():
    spec, notes = _spec("model=tiny_dense", "cluster.hardware=cpu", "cluster.gpus_per_node=2",
                        "parallel.tp=2")
    assert spec.parallel.tp_comm_overlap is False  # the local spec has no TP overlap
    assert any("needs TE layers" in n for n in notes)
    spec, _ = _spec("model=llama3.1_70b", "cluster.hardware=h100", "cluster.num_nodes=8",
                    "parallel.tp=4", "parallel.pp=4", "parallel.sequence_parallel=false")
    assert spec.parallel.tp_comm_overlap is False


def test_torchtitan_states_its_own():
    spec, notes = _spec("framework=torchtitan", "model=llama3_8b", "cluster.hardware=h100",
                        "cluster.num_nodes=4", "parallel.tp=2")
    assert spec.parallel.tp_comm_overlap is False and spec.parallel.grad_reduce_in_fp32
    assert notes == []
