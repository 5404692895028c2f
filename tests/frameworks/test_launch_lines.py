"""Launch-line flags read as Megatron-LM reads them: --padded-vocab-size, batch
schedules, the cross entropy's kernel, group-limited routing, --rotary-percent, other
entry points, and flags listed as not modelled with their reason."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from primus_ext.frameworks.megatron.args import parse_launch_args, warning_lines
from primus_ext.frameworks.megatron.flags import megatron_argv
from primus_ext.frameworks.megatron.launch import main
from primus_ext.spec.model import padded_vocab

DATA = Path(__file__).resolve().parents[1] / "data" / "launch_scripts"
BASE = ["--num-layers", "4", "--hidden-size", "512", "--num-attention-heads", "8",
        "--seq-length", "1024", "--max-position-embeddings", "1024", "--bf16",
        "--target-hardware", "h100", "--target-nodes", "1", "--target-gpus-per-node", "8"]
MOE = BASE + ["--num-experts", "8", "--moe-router-topk", "2"]


def _parse(*extra: str, base=BASE):
    return parse_launch_args(list(base) + list(extra))


def test_padded_vocab_size_is_the_embedding_as_given():
    # Pai-Megatron-Patch's Qwen lines: --padded-vocab-size 151936 at TP 2. Megatron-LM
    # pads nothing more (build_tokenizer: 'if padded_vocab_size is None').
    la = _parse("--padded-vocab-size", "151936", "--tensor-model-parallel-size", "2",
                "--patch-tokenizer-type", "Qwen2Tokenizer")
    m = la.spec.model
    assert m.vocab_size == 151936 and m.make_vocab_size_divisible_by == 64
    assert padded_vocab(m.vocab_size, m.make_vocab_size_divisible_by, 2) == 151936
    assert any("--padded-vocab-size 151936, taken as given" in x for x in la.notes)
    back = parse_launch_args(megatron_argv(la.spec) + BASE[-6:])
    assert back.spec == la.spec
    with pytest.raises(ValueError, match="not divisible by --tensor-model-parallel-size 4"):
        _parse("--padded-vocab-size", "151938", "--tensor-model-parallel-size", "4")


def test_step_batch_size_schedule_projects_the_steady_batch():
    # The line: no --global-batch-size, the schedule ends at 1152.
    la = _parse("--step-batch-size-schedule", "0:384 200B:768 400B:1152")
    assert la.spec.train.global_batch_size == 1152
    assert any("steady global batch 1152 (the last of its 3 steps;" in x for x in la.notes)
    assert "--step-batch-size-schedule" not in la.no_effect + la.not_modelled
    # Split over tokens as bash passes an unquoted schedule; commas as separators.
    assert _parse("--step-batch-size-schedule", "0:16", "2.4B:320", "12B:64") \
        .spec.train.global_batch_size == 64
    assert _parse("--step-batch-size-schedule", "0:16,1M:32").spec.train \
        .global_batch_size == 32
    with pytest.raises(ValueError, match="Cannot specify both"):
        _parse("--step-batch-size-schedule", "0:16 1B:32", "--global-batch-size", "64")
    with pytest.raises(ValueError, match="first threshold must be 0"):
        _parse("--step-batch-size-schedule", "1K:16 1B:32")


def test_rampup_batch_size_projects_the_final_batch_and_names_the_ramp():
    la = _parse("--rampup-batch-size", "16", "8", "300000", "--global-batch-size", "1024")
    assert la.spec.train.global_batch_size == 1024
    assert any("--rampup-batch-size 16 8 300000" in x and "from 16 by 8" in x
               for x in la.notes)


def test_cross_entropy_impl_counts_only_under_the_fusion():
    la = _parse("--cross-entropy-fusion-impl", "te")
    t = la.spec.train
    assert (t.cross_entropy_loss_fusion, t.cross_entropy_fusion_impl) == (False, "native")
    assert any("unfused vocab-parallel cross entropy" in x for x in la.notes)
    t = _parse("--cross-entropy-loss-fusion", "--cross-entropy-fusion-impl", "te").spec.train
    assert (t.cross_entropy_loss_fusion, t.cross_entropy_fusion_impl) == (True, "te")
    from primus_ext.memory.head import head_items
    spec = _parse("--cross-entropy-loss-fusion", "--cross-entropy-fusion-impl", "te").spec
    items = head_items(spec.model, spec.parallel, spec.train)
    assert "loss.exp_logits" not in items  # no fp32 copy of the logits under TE's kernel
    spec = _parse("--cross-entropy-fusion-impl", "te").spec
    assert "loss.exp_logits" in head_items(spec.model, spec.parallel, spec.train)


def test_router_groups_are_checked_only_with_a_group_topk():
    la = _parse("--moe-router-num-groups", "1", base=MOE)
    assert la.spec.model.moe_router_num_groups is None
    assert any("without --moe-router-group-topk" in x for x in la.notes)
    m = _parse("--moe-router-num-groups", "4", "--moe-router-group-topk", "2",
               base=MOE).spec.model
    assert (m.moe_router_num_groups, m.moe_router_group_topk) == (4, 2)
    with pytest.raises(ValueError, match="moe_router_num_groups must be specified"):
        _parse("--moe-router-group-topk", "2", base=MOE)


def test_rotary_percent_is_read_and_written():
    la = _parse("--position-embedding-type", "rope", "--rotary-percent", "0.5")
    assert la.spec.model.rotary_percent == 0.5
    assert "--rotary-percent" not in la.no_effect + la.not_modelled
    argv = megatron_argv(la.spec)
    assert argv[argv.index("--rotary-percent") + 1] == "0.5"
    # megatron-core's local spec (unfused RoPE) saves cos/sin over the rotated dims only.
    from primus_ext.memory.act_layer import attention_items
    from primus_ext.memory.dims import Dims

    def cos_sin(pct: str) -> int:
        spec = _parse("--position-embedding-type", "rope", "--rotary-percent", pct,
                      "--transformer-impl", "local").spec
        d = Dims.of(spec.parallel, spec.train)
        return attention_items(spec.model, spec.train, d)["rope.cos_sin"]
    assert cos_sin("0.5") * 2 == cos_sin("1.0") > 0
    with pytest.raises(ValueError, match="rotary_percent"):
        _parse("--rotary-percent", "0")


def test_aligned_param_gather_is_megatron_lms_default_with_virtual_stages():
    # Megatron-LM core_v0.16.1 arguments.py: --no-align-param-gather (store_false, so on
    # by default), set back to False without virtual stages; training.py installs the
    # param_sync_func only with --overlap-param-gather.
    pipe = ("--pipeline-model-parallel-size", "2", "--global-batch-size", "64",
            "--target-nodes", "2", "--use-distributed-optimizer", "--overlap-grad-reduce")
    vp = ("--num-layers-per-virtual-pipeline-stage", "1")
    gather = ("--overlap-param-gather",)
    on = _parse(*pipe, *gather, *vp)
    assert on.spec.parallel.align_param_gather
    assert "--no-align-param-gather" not in megatron_argv(on.spec)
    assert not _parse(*pipe, *gather).spec.parallel.align_param_gather
    assert not _parse(*pipe, *vp).spec.parallel.align_param_gather
    off = _parse(*pipe, *gather, *vp, "--no-align-param-gather")
    assert not off.spec.parallel.align_param_gather
    assert "--no-align-param-gather" not in "; ".join(off.no_effect + off.not_modelled)
    grad_off = _parse(*pipe, *vp, "--no-align-grad-reduce")
    assert not grad_off.spec.parallel.align_grad_reduce
    assert "--no-align-grad-reduce" not in "; ".join(grad_off.no_effect + grad_off.not_modelled)
    assert "--no-align-param-gather" in megatron_argv(off.spec)


@pytest.mark.parametrize("extra", [("--hybrid-override-pattern", "M-M*-M-"),
                                   ("--mamba-state-dim", "128"),
                                   ("--hybrid-layer-pattern=M*M*",)])
def test_mamba_and_hybrid_lines_are_refused_in_one_line(extra, capsys):
    # No --num-layers: a hybrid pattern sets it; the refusal comes first.
    argv = ["--hidden-size", "512", "--num-attention-heads", "8", "--seq-length", "1024",
            *extra, "--project-only", "--projection-backend", "simulate"]
    assert main(argv) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pretrain_gpt.py models" in err[0]
    assert "Mamba/hybrid" in err[0] and "--num-layers" not in err[0]


def test_flags_that_change_kernels_are_not_modelled_with_their_reason():
    la = _parse("--no-bias-swiglu-fusion", "--use-nccl-ub", "--softmax-type", "learnable",
                "--empty-unused-memory-level", "0", "--lr", "1e-4")
    nm = "; ".join(la.not_modelled)
    assert "--no-bias-swiglu-fusion (unfused elementwise kernels" in nm
    assert "--use-nccl-ub (NCCL user buffers" in nm and "--softmax-type (attention" in nm
    assert "--empty-unused-memory-level" in la.no_effect  # level 0: Megatron's default
    assert "--lr" in la.no_effect
    assert warning_lines(la)[0].startswith("primus-ext: not modelled")
    # Modelled: megatron-core's unfused RoPE, and the clamps of a gated unit.
    rope = _parse("--no-rope-fusion", "--activation-func-clamp-value", "7.0")
    assert not rope.spec.train.apply_rope_fusion and rope.not_modelled == ()
    assert rope.spec.model.activation_func_clamp_value == 7.0
    assert not _parse("--position-embedding-type", "yarn").spec.train.apply_rope_fusion
    assert _parse("--position-embedding-type", "rope").spec.train.apply_rope_fusion
    # Timers synchronise the device from level 1 (megatron-core timers.py).
    assert any(x.startswith("--timing-log-level (timers")
               for x in _parse("--timing-log-level", "2").not_modelled)
    assert "--timing-log-level" in _parse("--timing-log-level", "0").no_effect


def test_the_captured_gpt3_schedule_matches_its_global_batch():
    doc = json.loads((DATA / "mlm_gpt3_175b.json").read_text())
    la = parse_launch_args(doc["flags"] + ["--target-nodes", "16"])
    assert la.spec.train.global_batch_size == 1536  # 12B:1536, and --global-batch-size
    assert any("Megatron-LM main refuses it beside --global-batch-size" in x
               for x in la.notes)


def _llama(opt: str, *extra: str):
    doc = json.loads((DATA / "rocm_llama2_70b.json").read_text())
    flags = [x for x in doc["flags"] if x not in (
        "--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather")]
    flags[flags.index("--optimizer") + 1] = opt
    return parse_launch_args(flags + ["--target-nodes", "4", "--target-hardware", "h100",
                                      *extra])


def test_muon_keeps_a_momentum_for_matrices_and_adam_for_the_rest():
    from primus_ext.memory import memory_report
    from primus_ext.memory.muon import muon_shard
    adam, muon, dist = (memory_report(_llama(o).spec).stages[0]
                        for o in ("adam", "muon", "dist_muon"))
    spec = _llama("muon").spec
    sh = muon_shard(spec.model, spec.parallel, 0)
    # Llama 2 70B at TP 8: the embedding and output (vocabulary padded to 32,768) and
    # the 161 RMSNorm weights keep Adam's 12 B.
    assert sh.adam_dense == 2 * 32768 * 8192 // 8 + (2 * 80 + 1) * 8192
    assert muon.optimizer_bytes == 8 * sh.muon_dense + 12 * sh.adam_dense
    assert adam.optimizer_bytes == 12 * (sh.muon_dense + sh.adam_dense)
    # DP 4, whole parameters in ping-pong order: a quarter, plus at most the largest
    # tensor's state (fc1: 2 x 28672 / 8 x 8192 elements at 8 B).
    quarter = muon.optimizer_bytes / 4
    assert quarter <= dist.optimizer_bytes <= quarter + 8 * 2 * 28672 // 8 * 8192


def test_muon_adds_newton_schulz_gemms_to_the_step():
    from primus_ext.project.estimate import project
    from primus_ext.project.optimizer import optimizer_step_s
    spec = _llama("muon").spec
    hw = spec.cluster.hardware
    from primus_ext.memory.muon import muon_shard
    sh = muon_shard(spec.model, spec.parallel, 0)
    # fc1 of one layer (2 x 28672 / 8 rows x 8192): 5 x (4 m^2 n + 2 m^3), m = 7168.
    fc1 = 5 * (4 * 7168 ** 2 * 8192 + 2 * 7168 ** 3)
    assert sh.ns_flops > 80 * fc1
    # BF16 GEMMs: --muon-fp32-matmul-prec medium casts X to bf16 (Emerging-Optimizers
    # v0.1.0 muon_utils.py newton_schulz); at most the asymptotic efficiency.
    gemm_s = sh.ns_flops / (hw.peak_tflops("bf16") * 1e12 * hw.gemm_efficiency)
    assert optimizer_step_s(spec, (0, 0)) > gemm_s
    dist = _llama("dist_muon").spec
    assert optimizer_step_s(dist, (0, 0)) < optimizer_step_s(spec, (0, 0)) / 3
    assert project(spec).step_time_s > project(_llama("adam").spec).step_time_s


def test_muon_with_the_distributed_optimizer_is_mains_dist_muon():
    la = _llama("muon", "--use-distributed-optimizer")
    assert la.spec.train.optimizer == "dist_muon"
    assert not la.spec.parallel.use_distributed_optimizer
    assert any("layer-wise parameter layout" in x for x in la.not_modelled)
    la = _llama("muon", "--use-distributed-optimizer", "--no-use-layer-wise-param-layout")
    assert la.not_modelled == ()


def test_dist_muon_shards_whole_parameters_as_megatron_lm_main_measured():
    """Megatron-LM main's functional tests on DGX H100 (tests/data/megatron_golden):
    gpt3_moe_mcore_te_ep8_resume_torch_dist_muon and ..._dist_muon (muon with the
    distributed optimizer, --no-use-layer-wise-param-layout) keep 1,096,738,304 and
    994,083,328 bytes after a step: 102.7 MB less. The embedding (25.8M parameters, one
    tensor) stays whole on one rank, so the largest rank saves only the Muon weights'
    share."""
    from primus_ext.memory import memory_report
    case = {c["case"]: c for c in json.loads(
        (DATA.parent / "megatron_golden" / "h100.json").read_text())["cases"]}
    base = "gpt3_moe_mcore_te_ep8_resume_torch_dist_"
    target = ["--target-hardware", "h100", "--target-nodes", "1",
              "--target-gpus-per-node", "8"]

    def states(name):
        st = memory_report(parse_launch_args(case[name]["argv"] + target).spec).stages[0]
        return st.param_bytes + st.grad_bytes + st.optimizer_bytes
    saved = states(base + "muon") - states(base + "dist_muon")
    measured = case[base + "muon"]["mem_allocated_bytes"] - \
        case[base + "dist_muon"]["mem_allocated_bytes"]
    assert measured == 102654976
    assert abs(saved / measured - 1) < 0.05, (saved, measured)


@pytest.mark.parametrize("flag", ["--overlap-grad-reduce", "--use-torch-fsdp2"])
def test_muon_is_refused_where_megatron_lm_refuses_it(flag):
    with pytest.raises(ValueError, match="Megatron-LM core_v0.16.1 refuses it"):
        _llama("muon", flag)
    la = _llama("muon", "--muon-num-ns-steps", "6", "--muon-momentum", "0.95")
    assert any(x.startswith("--muon-num-ns-steps (") for x in la.not_modelled)
    assert "--muon-momentum" in la.no_effect


def _script(name: str, *extra: str, set_: dict | None = None):
    doc = json.loads((DATA / f"{name}.json").read_text())
    flags = list(doc["flags"])
    for flag, value in (set_ or {}).items():
        flags[flags.index(flag) + 1] = value
    t = doc["target"]
    return parse_launch_args(flags + ["--target-nodes", str(t["nodes"]),
                                      "--target-gpus-per-node", str(t["gpus_per_node"]),
                                      "--target-hardware", t["hardware"], *extra])


def test_pai_tokenizers_give_the_models_embedding():
    # Pai-Megatron-Patch: base vocabulary + --extra-vocab-size is the padded size, as the
    # models' config.json vocab_size (Qwen2.5-0.5B 151936, 7B/72B 152064, DeepSeek-V2-Lite
    # 102400, Llama 3.1 128256).
    for name, size in (("pai_qwen2_5_0_5b", 151936), ("pai_qwen2_5_72b", 152064),
                       ("pai_deepseek_v2_lite", 102400), ("pai_llama3_1_8b", 128256)):
        la = _script(name)
        assert la.spec.model.vocab_size == size, name
        assert any("--patch-tokenizer-type" in n and "padded size" in n for n in la.notes)


def test_pai_deepseek_v2_lite_readme_layout_is_refused_as_megatron_refuses_it():
    # The README's example runs DeepSeek-V2-Lite (27 layers) at PP 4.
    with pytest.raises(ValueError, match="--num-layers 27 .* not divisible by "
                                         "--pipeline-model-parallel-size 4"):
        _script("pai_deepseek_v2_lite", set_={"--pipeline-model-parallel-size": "4",
                                              "--expert-model-parallel-size": "2"})


def test_a_gh200_cluster_line_targets_four_gpus_a_node():
    la = _script("swissai_llama3_70b_gh200")
    c = la.spec.cluster
    assert (c.num_nodes, c.gpus_per_node, c.hardware.name) == (32, 4, "gh200")
    p = la.spec.parallel
    assert (p.tp, p.pp, p.vpp, p.sequence_parallel) == (4, 8, 2, True)
    assert la.spec.train.defer_embedding_wgrad_compute
    # Its tokenizer's size is not citable here: assumed, and said.
    assert any("ASSUMED 32000" in n and "alehc/swissai-tokenizer" in n for n in la.notes)


VERDICTS = json.loads((Path(__file__).resolve().parents[1] / "data" / "megatron_flags"
                       / "validate_core_v0.16.1_lines.json").read_text())


@pytest.mark.parametrize("case", VERDICTS["cases"], ids=lambda c: " ".join(c["flags"]))
def test_lines_megatron_lm_refuses_are_refused_or_named(case):
    """Megatron-LM core_v0.16.1's own verdicts (tests/data/megatron_flags): a line it
    accepts parses; one it refuses is refused here, or (a flag of Megatron-LM main) the
    note names core_v0.16.1's refusal."""
    argv = VERDICTS["base"] + case["flags"] + ["--target-hardware", "h100",
                                               "--target-nodes", "1",
                                               "--target-gpus-per-node", "8"]
    if case["ok"]:
        assert parse_launch_args(argv).spec
        return
    msg = case["message"]
    # What Megatron-LM main accepts (its step schedule, its deprecated ramp-up, muon with
    # the distributed optimizer) parses with a note naming core_v0.16.1's refusal.
    main_accepts = ("unrecognized arguments" in msg or "rampup" in msg
                    or "distributed optimizer" in msg)
    try:
        la = parse_launch_args(argv)
    except ValueError as exc:
        assert ("Megatron-LM core_v0.16.1 refuses it" in str(exc) or "divisible" in str(exc)
                or "Cannot specify both" in str(exc)), exc  # main: schedule beside GBS
        return
    assert main_accepts and any("core_v0.16.1" in n for n in la.notes), msg


def test_captured_gh200_and_snellius_lines_are_ones_megatron_lm_accepts():
    for name, verdict in VERDICTS["scripts"].items():
        assert verdict["ok"] and (DATA / f"{name}.json").exists()
        assert _script(name).spec


def test_torch_fsdp2_without_reshard_after_forward_is_zero2():
    # Megatron-LM core_v0.16.1 arguments.py --torch-fsdp2-no-reshard-after-forward
    # (store_false, dest torch_fsdp2_reshard_after_forward), read by training.py into
    # TorchFullyShardedDataParallelConfig(reshard_after_forward=...) under
    # --use-torch-fsdp2 only.
    fsdp2 = ("--use-torch-fsdp2", "--no-gradient-accumulation-fusion", "--ckpt-format",
             "torch_dist", "--untie-embeddings-and-output-weights")
    z2 = _parse(*fsdp2, "--torch-fsdp2-no-reshard-after-forward")
    assert z2.spec.parallel.fsdp and not z2.spec.parallel.fsdp_reshard_after_forward
    assert "--torch-fsdp2-no-reshard-after-forward" in megatron_argv(z2.spec)
    assert "--torch-fsdp2-no-reshard-after-forward" not in "; ".join(z2.no_effect)
    z3 = _parse(*fsdp2)
    assert z3.spec.parallel.fsdp_reshard_after_forward
    assert "--torch-fsdp2-no-reshard-after-forward" not in megatron_argv(z3.spec)
    alone = _parse("--torch-fsdp2-no-reshard-after-forward")
    assert alone.spec.parallel.fsdp_reshard_after_forward
    assert any("--torch-fsdp2-no-reshard-after-forward" in n for n in alone.notes)
