"""The costed layout of a torchtitan MoE job: torchtitan 0.3.0's MoE path
(models/common/token_dispatcher.py AllToAllTokenDispatcher, models/common/moe.py
GroupedExperts, models/common/moe_sharding.py) whatever megatron-core switches the spec
holds, and the notes that say so."""
import primus_ext
from primus_ext.project.torchtitan import MOE_AS_TORCHTITAN, simulated_view

JOB = ["framework=torchtitan", "model=qwen3_30b_a3b", "cluster.hardware=h100",
       "cluster.num_nodes=2", "train.global_batch_size=64", "train.seq_length=4096"]


def test_moe_block_is_costed_as_torchtitan_runs_it():
    spec = primus_ext.compose(JOB + ["parallel.ep=8", "parallel.moe_token_dispatcher_type="
                                     "flex", "parallel.moe_permute_fusion=true"])
    view = simulated_view(spec).parallel
    for k, v in MOE_AS_TORCHTITAN.items():
        assert getattr(view, k) == v, k
    assert (view.ep, view.etp) == (8, 1)  # EP on: experts not over TP
    tp2 = simulated_view(primus_ext.compose(JOB + ["parallel.tp=2"])).parallel
    assert (tp2.ep, tp2.etp) == (1, 2)  # EP off: experts TP-sharded like a dense MLP
    notes = primus_ext.project(spec).notes
    assert any("MoE as torchtitan 0.3.0 runs it" in n and
               "moe_token_dispatcher_type='flex'" in n for n in notes)
    # No CUDA graph under EP with the all-to-all dispatcher (it syncs with the host) ...
    assert not any("CUDA graph" in n for n in notes)
    # ... but by default without PP or EP, which the projection says it does not model.
    plain = primus_ext.project(primus_ext.compose(JOB)).notes
    assert any("CUDA graph" in n and "not modelled" in n for n in plain)


def test_dense_models_keep_megatron_s_moe_switches_out():
    spec = primus_ext.compose(["framework=torchtitan", "model=qwen3_14b",
                               "cluster.hardware=h100", "cluster.num_nodes=2",
                               "train.global_batch_size=64", "train.seq_length=4096"])
    view = simulated_view(spec).parallel
    assert (view.ep, view.etp) == (1, None)
    assert not any("MoE as" in n for n in primus_ext.project(spec).notes)
