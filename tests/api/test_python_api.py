"""The stable Python API of ARCHITECTURE.md: compose, project, memory, tune."""
import dataclasses
import importlib

import primus_ext


def test_compose_project_memory_are_callable_after_any_import():
    # Importing the subpackages binds them as attributes of primus_ext; the API names
    # must still be callable with the documented signatures.
    importlib.import_module("primus_ext.project.estimate")
    importlib.import_module("primus_ext.memory.report")
    importlib.import_module("primus_ext.tune.run")
    spec = primus_ext.compose(["model=llama3_8b", "parallel.tp=2"])
    est = primus_ext.project(spec)
    mem = primus_ext.memory(spec)
    assert est.memory.peak_bytes == mem.peak_bytes
    assert est.to_dict()["tokens_per_s_per_gpu"] == est.tokens_per_s_per_gpu
    assert callable(primus_ext.tune)


def test_spec_variants_with_dataclasses_replace():
    spec = primus_ext.compose(["model=llama3_70b", "cluster.num_nodes=8", "parallel.tp=4"])
    wider = dataclasses.replace(spec, parallel=dataclasses.replace(spec.parallel, tp=8))
    assert wider.dp == spec.dp // 2
    a, b = primus_ext.project(spec), primus_ext.project(wider)
    # TP8 moves more traffic over the same links than TP4 for the same job.
    assert b.breakdown["tp_comm_s"] / b.step_time_s >= a.breakdown["tp_comm_s"] / a.step_time_s


def test_compose_rejects_an_illegal_layout_with_the_rule():
    import pytest
    with pytest.raises(ValueError, match="num_attention_heads=32 is not divisible by parallel.tp=3"):
        primus_ext.compose(["model=llama3_8b", "parallel.tp=3", "cluster.num_nodes=3"])
