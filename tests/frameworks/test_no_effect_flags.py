"""No MoE, dispatcher, MTP or CUDA-graph flag of Megatron-LM is called "no effect".

The flag lists are Megatron-LM's own (tests/data/megatron_flags/: every option string of
core_v0.16.1's ``add_megatron_arguments`` and main's TransformerConfig-derived flags with
those names): each is either read by the flag table or reported as not modelled."""
from pathlib import Path

import pytest

from primus_ext.frameworks.megatron.args import parse_launch_args, warning_lines
from primus_ext.frameworks.megatron.no_effect import NO_EFFECT
from primus_ext.frameworks.megatron.table import BY_NAME

DATA = Path(__file__).resolve().parents[1] / "data" / "megatron_flags"


def _flags(name: str) -> list[str]:
    return [ln.strip() for ln in (DATA / name).read_text().splitlines()
            if ln.strip() and not ln.startswith("#")]


@pytest.mark.parametrize("name", ["moe_cuda_graph_core_v0.16.1.txt",
                                  "moe_cuda_graph_main_d98e8a64.txt"])
def test_no_moe_or_cuda_graph_flag_is_no_effect(name):
    flags = _flags(name)
    assert len(flags) > 50
    assert [f for f in flags if f in NO_EFFECT] == []


def test_an_unread_moe_flag_is_reported_not_modelled():
    argv = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
            "--seq-length", "128", "--max-position-embeddings", "128", "--num-experts", "4", "--moe-token-drop-policy", "position",
            "--moe-grouped-gemm", "--target-hardware", "h100", "--target-nodes", "1",
            "--target-gpus-per-node", "8"]
    la = parse_launch_args(argv)
    assert any(x.startswith("--moe-token-drop-policy (MoE variants")
               for x in la.not_modelled)
    assert "--moe-grouped-gemm" in BY_NAME and la.spec.parallel.moe_grouped_gemm
    assert any("not modelled" in ln for ln in warning_lines(la))


def test_router_terms_are_read_from_their_flags():
    """megatron-core moe/router.py: each optional term of the router, as its flag
    turns it on (the aux loss only with a positive coefficient)."""
    base = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
            "--seq-length", "128", "--max-position-embeddings", "128", "--num-experts", "8", "--target-hardware", "h100",
            "--target-nodes", "1", "--target-gpus-per-node", "8"]
    la = parse_launch_args(base + ["--moe-aux-loss-coeff", "1e-2", "--moe-z-loss-coeff",
                                   "1e-3", "--moe-router-score-function", "sigmoid",
                                   "--moe-router-enable-expert-bias"])
    assert la.spec.parallel.moe_router_terms == ("aux_loss", "z_loss", "expert_bias",
                                                 "sigmoid")
    assert parse_launch_args(base + ["--moe-aux-loss-coeff", "0"]).spec.parallel \
        .moe_router_terms == ()


def test_every_megatron_lm_flag_is_read_listed_with_its_reason_or_refused():
    """All 681 option strings of Megatron-LM core_v0.16.1: read by the flag table,
    listed as having no effect or as not modelled (each with its reason), or refused
    (other models' and deprecated flags) -- none falls through as unknown."""
    from primus_ext.frameworks.megatron.args import is_known
    from primus_ext.frameworks.megatron.line_flags import REFUSED
    from primus_ext.frameworks.megatron.no_effect import LISTED_NOT_MODELLED
    flags = _flags("all_core_v0.16.1.txt")
    assert len(flags) == 681
    assert [f for f in flags if not is_known(f) and f not in REFUSED] == []
    assert not set(NO_EFFECT) & set(LISTED_NOT_MODELLED)
    assert not set(BY_NAME) & (set(NO_EFFECT) | set(LISTED_NOT_MODELLED))


@pytest.mark.parametrize("flag", ["--batch-size", "--checkpoint-activations"])
def test_deprecated_flags_are_refused_as_megatron_lm_refuses_them(flag):
    argv = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
            "--seq-length", "128", flag, "8"]
    with pytest.raises(ValueError, match=f"{flag}: Megatron-LM refuses it"):
        parse_launch_args(argv)
