"""torchtitan's command line <-> the project's spec: parse and emit, one table.

torchtitan 0.3.0 (``torchtitan.config.manager.ConfigManager``): ``--module M --config F``
picks a config-registry function (``torchtitan/models/<M>/config_registry.py``), whose
values tyro flags ``--<section>.<field>`` override; booleans are bare flags
(``--compile.enable``, ``--parallelism.no-enable-sequence-parallel``); the
activation-checkpoint policy is a subcommand (``activation-checkpoint:none|selective|
full``) that comes last. Field names take ``_`` or ``-``.

``FLAGS`` holds every flag that changes step time or memory: the key parsing sets and the
value a spec emits, side by side; both directions read it. Flags in ``NO_EFFECT`` are
accepted and change nothing the projection models (one line lists them); any other flag
is accepted with a warning that it is not modelled.
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Callable

from primus_ext.frameworks.torchtitan.registry import (REGISTRY, Registry, lookup,
                                                        registry_for)

AC_SUBCOMMAND = "activation-checkpoint:"


@dataclass(frozen=True, slots=True)
class Flag:
    """One torchtitan flag: what parsing it sets (``key`` of TitanArgs.values) and what
    a spec writes for it (``emit``: the value, or None to leave torchtitan's default;
    a bool flag writes ``--x`` for True and ``--section.no-x`` for False)."""
    flag: str  # torchtitan's flag, underscore spelling
    key: str
    kind: str  # int | str | bool
    emit: Callable


def _pp(spec, value):
    return value if spec.parallel.pp > 1 else None


def _local_batch(spec) -> int:
    """Samples per data-parallel rank per pipeline flush: the microbatch without PP (more
    microbatches are gradient accumulation steps), the whole step's share under PP (one
    flush of global / dp samples, cut into pipeline microbatches)."""
    t = spec.train
    return t.micro_batch_size if spec.parallel.pp == 1 else t.global_batch_size // spec.dp


def _layers_per_stage_flag(spec):
    from primus_ext.spec.torchtitan import SINGLE_STAGE_SCHEDULES
    p = spec.parallel
    if p.pp == 1 or p.vpp == (1 if p.schedule in SINGLE_STAGE_SCHEDULES else 2):
        return None  # torchtitan's default stages per rank
    return _layers_per_stage(spec.model.num_layers, p.pp * p.vpp)


FLAGS = (
    Flag("--parallelism.data_parallel_replicate_degree", "dp_replicate", "int",
         lambda s: s.parallel.dp_replicate),
    Flag("--parallelism.data_parallel_shard_degree", "dp_shard", "int",
         lambda s: s.parallel.dp_shard),
    Flag("--parallelism.tensor_parallel_degree", "tp", "int", lambda s: s.parallel.tp),
    Flag("--parallelism.enable_sequence_parallel", "sequence_parallel", "bool",
         lambda s: False if s.parallel.tp > 1 and not s.parallel.sequence_parallel
         else None),
    Flag("--parallelism.pipeline_parallel_degree", "pp", "int", lambda s: s.parallel.pp),
    Flag("--parallelism.pipeline_parallel_schedule", "schedule", "str",
         lambda s: _pp(s, s.parallel.schedule)),
    Flag("--parallelism.pipeline_parallel_microbatch_size", "pp_microbatch_size", "int",
         lambda s: _pp(s, s.train.micro_batch_size)),
    Flag("--parallelism.pipeline_parallel_layers_per_stage", "layers_per_stage", "int",
         _layers_per_stage_flag),
    Flag("--parallelism.context_parallel_degree", "cp", "int", lambda s: s.parallel.cp),
    Flag("--parallelism.expert_parallel_degree", "ep", "int", lambda s: s.parallel.ep),
    Flag("--training.local_batch_size", "local_batch_size", "int", _local_batch),
    Flag("--training.global_batch_size", "global_batch_size", "int",
         lambda s: s.train.global_batch_size),
    Flag("--training.seq_len", "seq_len", "int", lambda s: s.train.seq_length),
    Flag("--compile.enable", "compile", "bool", lambda s: s.train.compile),
    # Trainer.Config._validate_cuda_graphs: CUDA graphs (on by default) refuse PP and EP
    # dispatchers that sync with the host (AllToAllTokenDispatcher does).
    Flag("--training.disable_cuda_graphs", "disable_cuda_graphs", "bool",
         lambda s: True if s.parallel.pp > 1 or (s.parallel.ep > 1 and s.model.is_moe)
         else None),
    Flag("--compile.enable_async_tensor_parallel", "async_tp", "bool",
         lambda s: True if s.parallel.tp_comm_overlap else None),
)
_BY_FLAG = {f.flag: f for f in FLAGS}

# Sections and flags that change neither step time nor memory in the model.
NO_EFFECT = ("--job.", "--metrics.", "--checkpoint.", "--profiler.", "--profiling.",
             "--validator.", "--dataloader.", "--optimizer.", "--lr_scheduler.",
             "--comm.", "--debug.", "--hf_assets_path", "--dump_folder",
             "--training.steps", "--training.max_norm", "--training.gc_freq",
             "--training.gc_debug",
             "--parallelism.spmd_backend", "--parallelism.pipeline_parallel_schedule_csv")


@dataclass(frozen=True, slots=True)
class TitanArgs:
    """A parsed torchtitan line: the registry entry and every modelled override."""
    registry: Registry
    values: dict
    ignored: tuple[str, ...] = ()
    not_modelled: tuple[str, ...] = ()

    def get(self, key: str, default=None):
        return self.values.get(key, default)


def _normal(flag: str) -> str:
    return "--" + flag[2:].replace("-", "_")


def _bool_flag(flag: str) -> tuple[str, bool] | None:
    """'--compile.enable' -> (flag, True); '--compile.no_enable' -> (flag, False)."""
    head, _, last = flag.rpartition(".")
    if last.startswith("no_") and f"{head}.{last[3:]}" in _BY_FLAG:
        return f"{head}.{last[3:]}", False
    if flag in _BY_FLAG and _BY_FLAG[flag].kind == "bool":
        return flag, True
    return None


def parse_titan(argv: list[str]) -> TitanArgs:
    """Parse a torchtitan command line (``torchtitan.train``'s arguments)."""
    module = config = None
    values: dict = {}
    ignored: list[str] = []
    not_modelled: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg.startswith(AC_SUBCOMMAND):
            ac = arg[len(AC_SUBCOMMAND):]
            if ac not in ("none", "selective", "full"):
                raise ValueError(f"{arg}: the projection models activation-checkpoint:"
                                 "none|selective|full")
            values["activation_checkpoint"] = ac
            i += 1
            continue
        if not arg.startswith("--"):
            raise ValueError(f"unexpected argument {arg!r} (torchtitan flags start with "
                             "--)")
        name, eq, inline = arg.partition("=")
        name = _normal(name)
        if name in ("--module", "--config"):
            if not eq:
                i += 1
                if i >= len(argv):
                    raise ValueError(f"{name} requires a value")
                inline = argv[i]
            module, config = (inline, config) if name == "--module" else (module, inline)
            i += 1
            continue
        b = _bool_flag(name)
        if b is not None and not eq:
            values[_BY_FLAG[b[0]].key] = b[1]
            i += 1
            continue
        takes_value = eq or (i + 1 < len(argv) and not argv[i + 1].startswith("--")
                             and not argv[i + 1].startswith(AC_SUBCOMMAND))
        if not eq and takes_value:
            i += 1
            inline = argv[i]
        i += 1
        flag = _BY_FLAG.get(name)
        if flag is None:
            (ignored if name.startswith(NO_EFFECT) else not_modelled).append(name)
            continue
        if flag.kind == "int":
            try:
                values[flag.key] = int(inline)
            except ValueError:
                raise ValueError(f"{name}={inline!r} must be an integer") from None
        elif flag.kind == "bool":
            raise ValueError(f"{name} is a switch: write {name} or "
                             f"{name.rpartition('.')[0]}.no-{name.rpartition('.')[2]}")
        else:
            values[flag.key] = inline
    return TitanArgs(registry=lookup(module, config), values=values,
                     ignored=tuple(ignored), not_modelled=tuple(not_modelled))


def _stages(num_layers: int, pp: int, multi: bool, layers_per_stage: int | None) -> int:
    """Stages per rank: pipeline_parallel._get_num_virtual_stages."""
    if layers_per_stage is None:
        return 2 if multi else 1
    stages = -(-(num_layers + 2) // layers_per_stage)
    if stages % pp:
        raise ValueError(f"--parallelism.pipeline_parallel_layers_per_stage="
                         f"{layers_per_stage}: {stages} virtual stages are not divisible "
                         f"by pipeline_parallel_degree={pp} (torchtitan "
                         "_get_num_virtual_stages)")
    return stages // pp


def to_overrides(ta: TitanArgs, num_layers: int, world_size: int) -> list[str]:
    """The Hydra overrides of a parsed line on ``world_size`` ranks."""
    from primus_ext.spec.torchtitan import (SCHEDULE_SIM, SINGLE_STAGE_SCHEDULES,
                                            canonical_schedule)
    r, v = ta.registry, ta.values
    tp, pp, cp = v.get("tp", r.tp), v.get("pp", r.pp), v.get("cp", 1)
    dp_rep, dp_shard = v.get("dp_replicate", 1), v.get("dp_shard", -1)
    shard = dp_shard if dp_shard != -1 else world_size // max(dp_rep * cp * tp * pp, 1)
    dp = max(dp_rep * shard, 1)
    local = v.get("local_batch_size", r.local_batch_size)
    gbs = v.get("global_batch_size", -1)
    gbs = local * dp if gbs < 0 else gbs
    schedule = v.get("schedule", r.schedule)
    # torch's get_schedule_class ignores case: take torchtitan's spelling of the name.
    canon = next((k for k in SCHEDULE_SIM if k.lower() == schedule.lower()),
                 canonical_schedule(schedule) or schedule)
    mbs = v.get("pp_microbatch_size", 1) if pp > 1 else local
    vpp = _stages(num_layers, pp, canon not in SINGLE_STAGE_SCHEDULES,
                  v.get("layers_per_stage")) if pp > 1 else 1
    compile_on = v.get("compile", r.compile)
    moe = bool(r.model_fields().get("num_moe_experts"))
    if (pp > 1 or (v.get("ep", r.ep) > 1 and moe)) and not v.get(
            "disable_cuda_graphs", not r.cuda_graphs):
        raise ValueError(
            "--training.disable_cuda_graphs is required with "
            + ("pipeline_parallel_degree > 1" if pp > 1 else
               "expert_parallel_degree > 1 and the AllToAllTokenDispatcher (it syncs with "
               "the host)") + " (torchtitan Trainer.Config._validate_cuda_graphs)")
    ov = ["framework=torchtitan", *r.hydra_overrides(),
          f"parallel.tp={tp}", f"parallel.pp={pp}", f"parallel.vpp={vpp}",
          f"parallel.cp={cp}", f"parallel.ep={v.get('ep', r.ep)}",
          f"parallel.dp_shard={dp_shard}", f"parallel.dp_replicate={dp_rep}",
          f"parallel.sequence_parallel={bool(v.get('sequence_parallel', True) and tp > 1)}",
          f"parallel.schedule={canon if pp > 1 else 'auto'}",
          f"parallel.tp_comm_overlap={bool(v.get('async_tp', r.async_tp))}",
          f"train.seq_length={v.get('seq_len', r.seq_len)}",
          f"train.micro_batch_size={mbs}", f"train.global_batch_size={gbs}",
          "train.activation_checkpoint="
          f"{v.get('activation_checkpoint', r.activation_checkpoint)}",
          f"train.compile={bool(compile_on)}",
          f"train.precision={'fp8' if r.float8 else 'bf16'}"]
    return ov


# ---- emit ------------------------------------------------------------------------
def float8_mismatch(spec) -> str | None:
    """Why the config function's float8 setting differs from ``train.precision``."""
    r = registry_for(spec.model)
    if (spec.train.precision == "fp8") == r.float8:
        return None
    return (f"train.precision={spec.train.precision}: torchtitan 0.3.0 sets float8 in the "
            f"config function (Float8LinearConverter in model_spec converters; no flag), "
            f"and {r.config} {'has' if r.float8 else 'has no'} Float8LinearConverter")


def titan_argv(spec, *, strict: bool = True) -> list[str]:
    """torchtitan's arguments for ``spec`` (a framework=torchtitan RunSpec). ``strict``
    refuses a precision the config function does not set (see float8_mismatch)."""
    if spec.framework != "torchtitan":
        raise ValueError(f"framework={spec.framework!r}: torchtitan's line needs "
                         "framework=torchtitan")
    r = registry_for(spec.model)
    p, t = spec.parallel, spec.train
    why = float8_mismatch(spec)
    if strict and why:
        raise ValueError(why)
    a = ["--module", r.module, "--config", r.config]
    for f in FLAGS:
        value = f.emit(spec)
        if value is None:
            continue
        if f.kind == "bool":
            head, _, last = f.flag.rpartition(".")
            a.append(f.flag if value else f"{head}.no-{last.replace('_', '-')}")
        else:
            a += [f.flag, str(value)]
    a.append(AC_SUBCOMMAND + t.activation_checkpoint)
    return a


def _layers_per_stage(num_layers: int, stages: int) -> int:
    from primus_ext.spec.torchtitan import layers_per_stage_for
    lps = layers_per_stage_for(num_layers, stages)
    if lps is None:
        raise ValueError(f"no pipeline_parallel_layers_per_stage gives {stages} virtual "
                         f"stages for {num_layers} layers (torchtitan "
                         "_get_num_virtual_stages)")
    return lps


def torchrun_line(spec, nproc_per_node: int | None = None, *, strict: bool = True) -> str:
    """``torchrun ... -m torchtitan.train <args>``, every value shlex-quoted."""
    c = spec.cluster
    n = nproc_per_node or c.node_size
    head = ["torchrun", f"--nnodes={c.num_nodes}", f"--nproc-per-node={n}", "-m",
            "torchtitan.train"]
    quoted = [shlex.quote(x) for x in head + titan_argv(spec, strict=strict)]
    return " ".join(quoted)


def script(spec, comment: str = "") -> str:
    lines = ["#!/usr/bin/env bash",
             "# torchtitan 0.3.0 launch line (primus-ext recipe). Multi-node: torchrun "
             "reads the rendezvous from PET_RDZV_BACKEND / PET_RDZV_ENDPOINT / "
             "PET_RDZV_ID (or add --rdzv-* flags).",
             f"# layout: {spec.layout.describe()}"]
    if comment:
        lines.append(f"# {comment}")
    lines.append("set -euo pipefail")
    registry_for(spec.model)  # no line torchtitan could run: ValueError, never a stub
    why = float8_mismatch(spec)
    if why:
        lines.append(f"# note: {why}; set it there before launching")
    # Extra flags go before the activation-checkpoint subcommand, which must come last.
    words = torchrun_line(spec, strict=False).split(" ")
    lines += [" ".join(words[:-1] + ['"$@"', words[-1]]), ""]
    return "\n".join(lines)
