"""The registry table (frameworks/torchtitan/registry.py) against torchtitan 0.3.0's own
config functions: their model dataclasses, their inherited defaults, and the parameter
count of the model they build (on the meta device)."""
import pytest

import primus_ext
from primus_ext.frameworks.torchtitan.flags import parse_titan, to_overrides
from primus_ext.frameworks.torchtitan.registry import (NOT_MODELLED, REGISTRY, lookup,
                                                        registry_for)
from primus_ext.spec.model import ModelSpec

pytest.importorskip("torchtitan")
from primus_ext.frameworks.torchtitan.registry_read import (  # noqa: E402
    model_fields, registry_values, trainer_config)

# llama3_405b wraps its linears in Float8LinearConverter, which needs torchao (not a
# dependency here): torchtitan itself cannot build that config without it.
try:
    import torchao  # noqa: F401
    ROWS = REGISTRY
except ImportError:
    ROWS = tuple(r for r in REGISTRY if not r.float8)
IDS = [r.config for r in ROWS]
# Fields the reader returns that are not ModelSpec fields or derive from others.
DERIVED = {"head_dim": lambda m: m.head_dim, "num_query_groups": lambda m: m.num_groups}


@pytest.fixture(scope="module")
def real():
    return {r.config: trainer_config(r.module, r.config) for r in ROWS}


@pytest.mark.parametrize("row", ROWS, ids=IDS)
def test_inherited_values_are_torchtitan_s(row):
    got = registry_values(row.module, row.config)
    ours = {k: getattr(row, k) for k in got}
    assert ours == got


@pytest.mark.parametrize("row", ROWS, ids=IDS)
def test_model_shape_is_torchtitan_s(row, real):
    theirs = model_fields(real[row.config].model_spec.model)
    ours = ModelSpec(**row.model_fields())
    theirs.pop("moe_token_dispatcher", None)
    diff = {}
    for k, v in theirs.items():
        mine = DERIVED[k](ours) if k in DERIVED else getattr(ours, k)
        if mine != v:
            diff[k] = (mine, v)
    assert not diff, f"{row.config}: (ours, torchtitan's) {diff}"
    assert registry_for(ours) == row


@pytest.mark.parametrize("row", ROWS, ids=IDS)
def test_parameter_count_is_the_built_model_s(row, real):
    """The memory model's parameters on one rank = torchtitan's model, built on the meta
    device (buffers such as MoE expert_bias are not parameters)."""
    torch = pytest.importorskip("torch")
    with torch.device("meta"):
        model = real[row.config].model_spec.model.build()
    built = sum(p.numel() for p in model.parameters())
    spec = primus_ext.compose(["framework=torchtitan", *row.hydra_overrides(),
                               "cluster.hardware=h200", "cluster.num_nodes=1",
                               "cluster.gpus_per_node=1", "train.global_batch_size=1",
                               "train.seq_length=2048"])
    ours = primus_ext.memory(spec).stages[0].num_params
    m = spec.model
    if row.module == "gpt_oss":
        # Not in the project's parameter groups (memory/params.py): gpt_oss's attention
        # sinks (one per head, gpt_oss/model.py Attention.sinks) and its router bias
        # (gate Linear bias=True, one per expert): exactly this many elements.
        assert built - ours == m.num_layers * (m.num_attention_heads + m.num_moe_experts)
    else:
        assert ours == built


def test_every_family_is_modelled_or_refused_with_its_reason():
    from torchtitan.models import _supported_models
    modelled = {r.module for r in REGISTRY}
    assert set(_supported_models) == modelled | set(NOT_MODELLED)
    assert {"llama3", "qwen3", "deepseek_v3", "gpt_oss"} <= modelled
    for module in NOT_MODELLED:
        with pytest.raises(ValueError, match=f"--module {module}: torchtitan ships it"):
            lookup(module, "x")
    with pytest.raises(ValueError, match="qwen3_30b_a3b"):
        lookup("qwen3", "qwen3_8b_first_85_pct_layers_nvfp4")


@pytest.mark.parametrize("line,model,ep,pp", [
    ("--module qwen3 --config qwen3_30b_a3b", "qwen3_30b_a3b", 1, 1),
    ("--module deepseek_v3 --config deepseek_v3_16b", "deepseek_v2_lite", 8, 1),
    ("--module deepseek_v3 --config deepseek_v3_671b --parallelism.pipeline_parallel_degree"
     " 4 --parallelism.expert_parallel_degree 8", "deepseek_v3", 8, 4),
])
def test_lines_compose_the_registry_model(line, model, ep, pp):
    ta = parse_titan(line.split())
    spec = primus_ext.compose(to_overrides(ta, ta.registry.model_fields()["num_layers"], 64)
                              + ["cluster.hardware=h100", "cluster.num_nodes=8"])
    assert spec.model.name == model and (spec.parallel.ep, spec.parallel.pp) == (ep, pp)
    assert spec.train.seq_length == 4096
    if "671b" in line:
        assert spec.model.mtp_num_layers == 0  # torchtitan's 671B: num_mtp_layers=0


@pytest.mark.parametrize("tp,ep,expert_div", [(1, 1, 1), (2, 1, 2), (2, 2, 2), (2, 4, 4),
                                              (1, 4, 4)])
def test_experts_split_over_tp_without_ep_and_over_ep_alone_with_it(tp, ep, expert_div):
    """torchtitan 0.3.0 models/common/moe_sharding.py: EP off, the routed experts are
    TP-sharded like a dense MLP (expert_param_placement_dense); EP on, they are split
    over ep only (expert_param_placement_sparse; EP borrows the TP ranks)."""
    spec = primus_ext.compose(["framework=torchtitan", "model=qwen3_moe_debugmodel",
                               "cluster.hardware=h100", "cluster.num_nodes=1",
                               f"parallel.tp={tp}", f"parallel.ep={ep}",
                               "train.global_batch_size=8", "train.seq_length=2048"])
    m = spec.model
    experts = m.num_layers * m.num_moe_experts * 3 * m.hidden_size * m.moe_ffn_hidden_size
    one = primus_ext.memory(primus_ext.compose(
        ["framework=torchtitan", "model=qwen3_moe_debugmodel", "cluster.hardware=h100",
         "cluster.num_nodes=1", "train.global_batch_size=8", "train.seq_length=2048"]))
    st = primus_ext.memory(spec).stages[0]
    dense_tp = st.num_params - experts // expert_div
    assert 0 < dense_tp <= one.stages[0].num_params - experts  # attention etc. over TP
    if tp == 1:
        assert dense_tp == one.stages[0].num_params - experts
    no_ep = primus_ext.memory(primus_ext.compose(
        ["framework=torchtitan", "model=qwen3_moe_debugmodel", "cluster.hardware=h100",
         "cluster.num_nodes=1", f"parallel.tp={tp}", "train.global_batch_size=8",
         "train.seq_length=2048"])).stages[0].num_params
    assert dense_tp == no_ep - experts // tp  # the same dense part, EP or not
    with pytest.raises(ValueError, match="decides the experts' TP"):
        primus_ext.compose(["framework=torchtitan", "model=qwen3_moe_debugmodel",
                            "cluster.hardware=h100", "cluster.num_nodes=1",
                            "parallel.tp=2", "parallel.ep=1", "parallel.etp=1",
                            "train.global_batch_size=8", "train.seq_length=2048"])
