"""Each misreading of a real launch line, fixed (issue: flag fidelity), on the captured
scripts of tests/data/launch_scripts."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from primus_ext.frameworks.megatron.args import parse_launch_args, warning_lines
from primus_ext.frameworks.megatron.flags import megatron_argv
from primus_ext.frameworks.megatron.vocab import count_tokens
from primus_ext.spec.model import padded_vocab

DATA = Path(__file__).resolve().parents[1] / "data" / "launch_scripts"


def _doc(name: str) -> dict:
    return json.loads((DATA / f"{name}.json").read_text())


def _parse(name: str, *extra: str, drop: tuple[str, ...] = ()):
    doc = _doc(name)
    flags = list(doc["flags"])
    for flag in drop:  # remove a flag and its value(s)
        i = flags.index(flag)
        j = i + 1
        while j < len(flags) and not flags[j].startswith("--"):
            j += 1
        del flags[i:j]
    t = doc["target"]
    return parse_launch_args(flags + ["--target-nodes", str(t["nodes"]),
                                      "--target-gpus-per-node", str(t["gpus_per_node"]),
                                      "--target-hardware", "h100", *extra])


def test_1_sequence_parallel_and_tp_comm_overlap_turn_off_at_tp1():
    la = _parse("mlm_llama3_8b_h100_fp8")  # --sequence-parallel with TP 1
    assert la.spec.parallel.tp == 1 and not la.spec.parallel.sequence_parallel
    assert any("--sequence-parallel turned off" in n for n in la.notes)
    la = _parse("zoo_qwen3_30b_1node")  # --tp-comm-overlap with TP 1
    assert not la.spec.parallel.tp_comm_overlap
    assert any("--tp-comm-overlap turned off" in n for n in la.notes)
    with pytest.raises(ValueError, match="--tp-comm-overlap needs --sequence-parallel"):
        _parse("rocm_llama2_70b", "--tp-comm-overlap", drop=("--sequence-parallel",))


def test_2_vocabulary_from_the_tokenizer_padded_as_megatron_pads_it(tmp_path):
    spec = _parse("mlm_mfsdp_deepseek_v3").spec  # deepseek-ai/DeepSeek-V3, by 3232
    assert spec.model.vocab_size == 129280
    assert padded_vocab(129280, 3232, spec.parallel.tp) == 129280
    la = _parse("zoo_qwen3_235b_h100")  # Qwen/Qwen3-235B-A22B, by 1187 x TP 2
    m = la.spec.model
    assert m.vocab_size == 151669 and la.spec.parallel.tp == 2
    assert padded_vocab(m.vocab_size, m.make_vocab_size_divisible_by, 2) == 151936
    assert any("vocabulary: Qwen/Qwen3-235B-A22B: 151669" in n for n in la.notes)
    assert _parse("rocm_llama2_70b").spec.model.vocab_size == 32000  # Llama-2 HF id
    assert _parse("mlm_gpt3_175b").spec.model.vocab_size == 50257  # GPT-2 BPE vocab
    la = _parse("mlm_mixtral_8x7b")  # Llama2Tokenizer, model file not on this machine
    assert la.spec.model.vocab_size == 32000
    assert any("Llama2Tokenizer without its file here" in n for n in la.notes)
    # A local GPT-2 style vocab.json is read, not assumed.
    vocab = tmp_path / "vocab.json"
    vocab.write_text(json.dumps({f"t{i}": i for i in range(50001)}))
    doc = _doc("mlm_gpt3_175b")
    flags = doc["flags"]
    i = flags.index("--vocab-file")
    flags = flags[:i + 1] + [str(vocab)] + flags[i + 2:]
    spec = parse_launch_args(flags + ["--target-nodes", "16"]).spec
    assert spec.model.vocab_size == 50001 == count_tokens(str(vocab))
    # Unknown tokenizer: said plainly, with how to set it.
    la = _parse("zoo_qwen3_30b_4node", "--tokenizer-model", "acme/unknown-tok")
    assert la.spec.model.vocab_size == 32000
    assert any("ASSUMED 32000" in n and "--vocab-size" in n for n in la.notes)


def test_3_virtual_pipeline_flags():
    spec = _parse("zoo_mixtral_8x22b").spec  # --num-virtual-stages-per-pipeline-rank 7
    assert (spec.parallel.pp, spec.parallel.vpp) == (8, 7)
    spec = _parse("zoo_deepseek_v3_h100").spec  # "Et|(tt|)*30mL"
    p = spec.parallel
    assert (p.pp, p.vpp) == (8, 4)
    assert p.pipeline_layout == (1,) + (2,) * 30 + (0,)
    spec = _parse("zoo_qwen3_235b_h100").spec  # 3 layers per virtual stage, +E +L
    lay = spec.layout.layers_per_virtual_stage
    assert spec.parallel.vpp == 4 and lay[0] == 2 and lay[-1] == 2 and sum(lay) == 94
    with pytest.raises(ValueError, match="pipeline-model-parallel-layout"):
        _parse("zoo_deepseek_v3_h100", "--pipeline-model-parallel-layout", "Et|(tt|)*29mL",
               drop=("--pipeline-model-parallel-layout",))


def test_4_memory_and_time_flags_reach_the_spec():
    t = _parse("zoo_deepseek_v3_h100").spec.train
    assert t.precision == "fp8" and t.fp8_recipe == "blockwise" and t.fp8_param_gather
    assert t.use_precision_aware_optimizer
    assert (t.main_grads_dtype, t.exp_avg_dtype, t.exp_avg_sq_dtype) == ("fp32", "bf16",
                                                                         "bf16")
    assert t.moe_router_dtype == "fp32"
    assert t.recompute_modules == ("mla_up_proj", "mlp")
    spec = _parse("zoo_deepseek_v3_h100").spec
    assert spec.parallel.overlap_moe_expert_parallel_comm  # with --delay-wgrad-compute
    spec = _parse("mlm_mfsdp_deepseek_v3").spec  # Megatron-FSDP bf16 grads and comm
    assert spec.parallel.fsdp and not spec.parallel.grad_reduce_in_fp32
    assert _parse("zoo_qwen3_30b_4node").spec.train.moe_router_force_load_balancing
    # Megatron-LM validate_args: bf16 main gradients are not accumulated in fp32.
    spec = _parse("zoo_deepseek_v3_h100", "--main-grads-dtype", "bf16",
                  drop=("--main-grads-dtype",)).spec
    assert spec.train.main_grads_dtype == "bf16" and not spec.parallel.grad_reduce_in_fp32


def test_5_model_shape_flags():
    m = _parse("mlm_gptoss_02_train").spec.model
    assert m.activation == "quick_geglu" and m.gated
    assert m.window_size == 127 and m.window_full_attention_every == 2
    assert _parse("rocm_llama2_70b").spec.model.position_embedding_type == "rope"
    la = _parse("mlm_gpt3_175b", "--use-rotary-position-embeddings")
    assert la.spec.model.position_embedding_type == "rope"
    la = _parse("mlm_gpt3_175b", "--no-position-embedding")
    assert la.spec.model.position_embedding_type == "none"


@pytest.mark.parametrize("name,extra,drop,match", [
    ("mlm_gpt3_175b", ("--bf16",), (), "--fp16 and --bf16 are exclusive"),
    # NVIDIA's GPT-OSS example at its default 8 GPUs: PP 8 for 12 layers.
    ("mlm_gptoss_02_train", ("--pipeline-model-parallel-size", "8"),
     ("--pipeline-model-parallel-size",), "--num-layers 12 .* not divisible by "
     "--pipeline-model-parallel-size 8"),
    ("mlm_mixtral_8x7b", ("--pipeline-model-parallel-size", "3"),
     ("--pipeline-model-parallel-size",), "not divisible by --pipeline-model-parallel-size 3"),
    ("mlm_gpt3_175b", ("--target-nodes", "0"), (), "--target-nodes 0: must be a positive"),
    ("zoo_deepseek_v3_h100", ("--delay-wgrad-compute",),
     ("--overlap-moe-expert-parallel-comm",), "needs --overlap-moe-expert-parallel-comm"),
])
def test_6_contradictions_are_refused_with_megatrons_reason(name, extra, drop, match):
    with pytest.raises(ValueError, match=match):
        _parse(name, *extra, drop=drop)


@pytest.mark.parametrize("name,extra,drop,match", [
    ("mlm_llama3_8b_h100_fp8", ("--fp8-format", "e5m2"), ("--fp8-format",),
     "argument --fp8-format: invalid choice: 'e5m2'"),
    ("mlm_gpt3_175b", ("--attention-backend", "cudnn"), ("--attention-backend",),
     "argument --attention-backend: invalid choice: 'cudnn'"),
    ("zoo_qwen3_235b_long32k", ("--cp-comm-type", "ring"), (),
     "argument --cp-comm-type: invalid choice: 'ring'"),
])
def test_6_unknown_values_exit_as_megatrons_argparse_does(name, extra, drop, match, capsys):
    with pytest.raises(SystemExit) as exc:
        _parse(name, *extra, drop=drop)
    assert exc.value.code == 2 and match in capsys.readouterr().err


def test_7_fp8_recipe_follows_megatron_and_defaults_are_not_written():
    spec = _parse("mlm_llama3_8b_h100_fp8").spec  # --fp8-format hybrid, no recipe
    assert spec.train.fp8_recipe == "delayed"
    argv = megatron_argv(spec)
    assert "--fp8-recipe" not in argv and "--fp8-format" in argv
    assert "--cp-comm-type" not in argv and "--attention-backend" not in argv


def test_8_warnings_split_unmodelled_from_no_effect():
    la = _parse("zoo_deepseek_v3_h100")
    lines = warning_lines(la)
    assert la.not_modelled == ()
    assert len(lines) == 1 and lines[0].startswith("primus-ext: no effect on step time")
    assert "--lr" in la.no_effect and len(la.no_effect) > 40
    la = _parse("zoo_deepseek_v3_h100", "--main-params-dtype", "fp16", "--some-new-knob")
    lines = warning_lines(la)
    assert lines[0].startswith("primus-ext: not modelled, may change step time:")
    assert "--some-new-knob" in lines[0] and "--main-params-dtype fp16" in lines[0]
    assert "--lr" in lines[1]
