"""train.loss_impl='torch': torch's F.cross_entropy on the logits in their own dtype (NeMo
AutoModel's MaskedCrossEntropy(fp32_upcast=False)). What it saves for the backward is held
against torch's own saved tensors; its op cost against megatron-core's unfused loss."""
import pytest
import torch
import torch.nn.functional as F

from primus_ext.compute.extra_ops import output_ops
from primus_ext.compute.ops import Shapes
from primus_ext.memory.head import head_items, loss_transient_bytes
from primus_ext.presets import hardware_preset
from primus_ext.published import DEFAULT_PATH, read_runs
from primus_ext.spec import ClusterSpec, ModelSpec, ParallelSpec, RunSpec, TrainSpec


def _model(vocab: int) -> ModelSpec:
    return ModelSpec(name="tiny", num_layers=2, hidden_size=64, num_attention_heads=4, vocab_size=vocab,
                     make_vocab_size_divisible_by=1, max_position_embeddings=32)


def _saved_bytes(logits: torch.Tensor, labels: torch.Tensor) -> int:
    seen: dict[int, int] = {}

    def pack(t):
        seen[id(t)] = t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        F.cross_entropy(logits.view(-1, logits.size(-1)), labels.view(-1), reduction="sum")
    return sum(seen.values())


@pytest.mark.parametrize("dtype,precision", [(torch.bfloat16, "bf16"), (torch.float32, "fp32")])
def test_saved_tensors_match_torch(dtype, precision):
    b, s, v = 2, 16, 320
    logits = torch.randn(b, s, v, dtype=dtype, requires_grad=True)
    labels = torch.randint(0, v, (b, s))
    train = TrainSpec(precision=precision, micro_batch_size=b, seq_length=s,
                      global_batch_size=b, loss_impl="torch")
    items = head_items(_model(v), ParallelSpec(), train, final_norm=False)
    ours = items["loss.log_softmax"] + items["loss.target"] + items["loss.total_weight"]
    assert ours == _saved_bytes(logits, labels)
    # the transient: nll_loss's gradient and log_softmax's input gradient
    assert loss_transient_bytes(_model(v), ParallelSpec(), train) == 2 * b * s * v * \
        logits.element_size()


def test_torch_loss_moves_fewer_bytes_than_megatrons_unfused_fp32_loss():
    def ce(loss_impl):
        spec = RunSpec(model=_model(32000), parallel=ParallelSpec(),
                       train=TrainSpec(micro_batch_size=2, seq_length=32, global_batch_size=2,
                                       loss_impl=loss_impl),
                       cluster=ClusterSpec(num_nodes=1, gpus_per_node=1,
                                           hardware=hardware_preset("h100")))
        return next(o for o in output_ops(Shapes(spec)) if o.name == "cross_entropy")
    mega, tor = ce("megatron"), ce("torch")
    # 4 + 5 passes of 2 B against 38 + 22 B per logit (compute/extra_ops.py)
    assert tor.fwd_s < mega.fwd_s / 3 and tor.dgrad_s < mega.dgrad_s / 1.5


def test_torch_loss_refuses_the_fusion_flag():
    with pytest.raises(ValueError, match="train.loss_impl"):
        TrainSpec(loss_impl="torch", cross_entropy_loss_fusion=True)
    with pytest.raises(ValueError, match="train.loss_impl"):
        TrainSpec(loss_impl="fused")


def test_automodel_rows_use_torchs_loss():
    rows = [r for r in read_runs(DEFAULT_PATH) if r.source == "NeMo-Automodel-perf-summary"]
    assert rows
    for r in rows:
        assert r.spec.train.loss_impl == "torch", r.run_id
        assert any("loss_impl" in n and "masked_ce.py" in n for n in r.notes), r.run_id
