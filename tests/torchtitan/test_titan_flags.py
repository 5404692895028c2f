"""torchtitan's command line: parse (as torchtitan reads it), emit, round trip, and
torchtitan's own parser on what is emitted (when torchtitan is installed)."""
import shlex

import pytest

import primus_ext
from primus_ext.frameworks.torchtitan.flags import (NO_EFFECT, parse_titan, titan_argv,
                                                    to_overrides, torchrun_line)

LINE = ("--module llama3 --config llama3_8b --parallelism.data_parallel_shard_degree -1 "
        "--parallelism.tensor_parallel_degree 2 --training.local_batch_size 2 "
        "--training.global_batch_size=64 --compile.enable --metrics.log_freq 10 "
        "--parallelism.fsdp-reshard-after-forward never activation-checkpoint:full")
CLUSTER = ["cluster.hardware=h100", "cluster.num_nodes=2"]


def test_parse_reads_what_torchtitan_reads():
    ta = parse_titan(shlex.split(LINE))
    assert ta.registry.config == "llama3_8b"
    assert ta.values == {"dp_shard": -1, "tp": 2, "local_batch_size": 2,
                         "global_batch_size": 64, "compile": True,
                         "activation_checkpoint": "full"}
    assert ta.ignored == ("--metrics.log_freq",)
    assert ta.not_modelled == ("--parallelism.fsdp_reshard_after_forward",)
    spec = primus_ext.compose(to_overrides(ta, 32, 16) + CLUSTER)
    assert (spec.framework, spec.parallel.tp, spec.dp, spec.train.micro_batch_size,
            spec.train.activation_checkpoint, spec.train.compile) == \
        ("torchtitan", 2, 8, 2, "full", True)
    assert spec.num_microbatches == 4  # gradient accumulation: 64 / (2 * 8)


def test_registry_defaults_apply_when_flags_are_absent():
    ta = parse_titan(["--module", "llama3", "--config", "llama3_70b"])
    spec = primus_ext.compose(to_overrides(ta, 80, 64) + ["cluster.hardware=h100",
                                                          "cluster.num_nodes=8"])
    # llama3_70b: tp 8, local batch 8, seq 8192, FullAC; global batch = local x dp.
    assert (spec.parallel.tp, spec.train.micro_batch_size, spec.train.seq_length,
            spec.train.activation_checkpoint, spec.train.global_batch_size) == \
        (8, 8, 8192, "full", 64)


@pytest.mark.parametrize("extra", [
    [], ["parallel.pp=2", "parallel.schedule=1F1B", "parallel.dp_replicate=2"],
    ["parallel.pp=2", "parallel.vpp=2", "parallel.schedule=Interleaved1F1B",
     "train.activation_checkpoint=selective"],
    ["parallel.tp=4", "parallel.sequence_parallel=false", "train.compile=true",
     "parallel.cp=2"],
    ["parallel.tp=2", "train.compile=true", "parallel.tp_comm_overlap=true"],
])
def test_emit_parse_round_trip(extra):
    spec = primus_ext.compose(["framework=torchtitan", "model=llama3.1_8b",
                               "train.global_batch_size=64"] + CLUSTER + extra)
    argv = titan_argv(spec)
    assert argv[-1].startswith("activation-checkpoint:")
    back = primus_ext.compose(to_overrides(parse_titan(argv), 32, spec.world_size)
                              + CLUSTER)
    assert back.parallel == spec.parallel or _same_layout(back, spec)
    assert back.train == spec.train


def _same_layout(a, b):
    fields = ("tp", "pp", "vpp", "cp", "ep", "dp_replicate", "sequence_parallel",
              "tp_comm_overlap")
    return all(getattr(a.parallel, f) == getattr(b.parallel, f) for f in fields)


def test_torchrun_line_is_quoted_and_torchtitan_parses_it():
    spec = primus_ext.compose(["framework=torchtitan", "model=llama3.1_8b",
                               "parallel.pp=2", "parallel.vpp=2",
                               "parallel.schedule=Interleaved1F1B",
                               "train.global_batch_size=64"] + CLUSTER)
    line = torchrun_line(spec)
    words = shlex.split(line)
    assert words[:3] == ["torchrun", "--nnodes=2", "--nproc-per-node=8"]
    assert words[3:5] == ["-m", "torchtitan.train"]
    manager = pytest.importorskip("torchtitan.config.manager")
    cfg = manager.ConfigManager().parse_args(words[5:])
    assert cfg.parallelism.pipeline_parallel_degree == 2
    assert cfg.parallelism.pipeline_parallel_schedule == "Interleaved1F1B"
    assert cfg.training.global_batch_size == 64
    assert cfg.activation_checkpoint is None  # activation-checkpoint:none


def test_bad_lines_raise_one_clear_error():
    with pytest.raises(ValueError, match="--module and --config are required"):
        parse_titan(["--training.seq_len", "4096"])
    with pytest.raises(ValueError, match="must be an integer"):
        parse_titan(["--module", "llama3", "--config", "llama3_8b",
                     "--parallelism.tensor_parallel_degree", "two"])
    with pytest.raises(ValueError, match="activation-checkpoint"):
        parse_titan(["--module", "llama3", "--config", "llama3_8b",
                     "activation-checkpoint:memory-budget"])
    assert any(p.startswith("--checkpoint.") for p in NO_EFFECT)


def test_emit_refuses_a_model_torchtitan_has_no_config_for():
    spec = primus_ext.compose(["framework=torchtitan", "model=gpt3_5b"] + CLUSTER)
    with pytest.raises(ValueError, match="no torchtitan config function"):
        titan_argv(spec)


def test_recipe_script_for_lines_torchtitan_cannot_express():
    from primus_ext.frameworks.torchtitan.flags import script
    fp8 = primus_ext.compose(["framework=torchtitan", "model=llama3.1_8b",
                              "train.precision=fp8"] + CLUSTER)
    text = script(fp8)
    assert "# note: train.precision=fp8" in text and "torchtitan.train" in text
    other = primus_ext.compose(["framework=torchtitan", "model=gpt3_5b"] + CLUSTER)
    with pytest.raises(ValueError, match="no torchtitan config function"):
        script(other)  # an error, never a script that only fails when run


def test_schedule_names_parse_in_any_case_as_torchtitan_does():
    ta = parse_titan(["--module", "llama3", "--config", "llama3_8b",
                      "--parallelism.pipeline_parallel_degree", "2",
                      "--parallelism.pipeline_parallel_schedule", "interleaved1f1b",
                      "--training.local_batch_size", "4",
                      "--training.disable_cuda_graphs"])
    spec = primus_ext.compose(to_overrides(ta, 32, 16) + CLUSTER)
    assert (spec.parallel.schedule, spec.parallel.vpp) == ("Interleaved1F1B", 2)


def test_cuda_graphs_must_be_off_where_torchtitan_requires_it():
    """Trainer.Config._validate_cuda_graphs: PP, and EP with the all-to-all dispatcher."""
    pp = ["--module", "llama3", "--config", "llama3_8b",
          "--parallelism.pipeline_parallel_degree", "2"]
    with pytest.raises(ValueError, match="_validate_cuda_graphs"):
        to_overrides(parse_titan(pp), 32, 16)
    ep = ["--module", "qwen3", "--config", "qwen3_30b_a3b",
          "--parallelism.expert_parallel_degree", "4"]
    with pytest.raises(ValueError, match="AllToAllTokenDispatcher"):
        to_overrides(parse_titan(ep), 48, 16)
    assert "parallel.ep=4" in to_overrides(
        parse_titan(ep + ["--training.disable_cuda_graphs"]), 48, 16)
    # deepseek_v3_16b's config function turns them off itself (and sets EP 8).
    assert "parallel.ep=8" in to_overrides(
        parse_titan(["--module", "deepseek_v3", "--config", "deepseek_v3_16b"]), 27, 16)
