"""Published torchtitan runs read with torchtitan's semantics (framework=torchtitan).

A row whose source is a torchtitan benchmark page ran torchtitan's trainer, so its spec
is a ``framework=torchtitan`` one: FSDP2 over the row's FSDP degree (``dp_shard``; the
``fsdp2(N)`` cell), TP with sequence parallelism, the activation-checkpoint policy of
the ``recompute`` column, and what the row's notes state: ``torch.compile``, Float8
(the precision column), AsyncTP, the pipeline schedule (``1F1B`` / ``Interleaved
1F1B``; torchtitan's default of two stages per rank for the interleaved one when the
row does not state the virtual stages). PP microbatches stay as the reader fills them
(pp microbatches per step): the benchmark's torchtitan (Dec. 2024) split the local batch
into ``pipeline_parallel_degree`` microbatches by default
(``experimental.pipeline_parallel_microbatches``), unlike 0.3.0's microbatch size 1.
"""
from __future__ import annotations

import re
from dataclasses import replace

from primus_ext.published.cells import _Row
from primus_ext.published.recompute import read_recompute
from primus_ext.published.row_facts import flag, pp_schedule
from primus_ext.spec.run import RunSpec

_FSDP_DEGREE = re.compile(r"fsdp2?\((\d+)\)", re.I)


def is_torchtitan_row(source: str) -> bool:
    """Rows measured with torchtitan's trainer (their source names the framework)."""
    return "torchtitan" in source.lower()


def torchtitan_spec(spec: RunSpec, row: dict, notes: list[str]) -> RunSpec:
    r = _Row(row, row.get("run_id") or "?")
    p, t = spec.parallel, spec.train
    m = _FSDP_DEGREE.search(row.get("fsdp_or_zero") or "")
    dp_shard = int(m.group(1)) if m else -1
    schedule, vpp = "auto", 1
    if p.pp > 1:
        schedule = pp_schedule(r, notes) or "1F1B"
        vpp = 2 if schedule == "Interleaved1F1B" else 1
    recompute = titan_checkpoint(r.text("recompute"), notes)
    compiled = flag(r, "compile", notes)
    async_tp = flag(r, "tp_comm_overlap", notes)
    par = replace(p, fsdp=False, use_distributed_optimizer=False, dp_shard=dp_shard,
                  dp_replicate=1, sequence_parallel=p.tp > 1, schedule=schedule, vpp=vpp,
                  tp_comm_overlap=async_tp and compiled, etp=None,
                  pipeline_layout=None, decoder_first_pipeline_num_layers=None,
                  decoder_last_pipeline_num_layers=None,
                  account_for_embedding_in_pipeline_split=False,
                  account_for_loss_in_pipeline_split=False)
    train = replace(t, recompute_granularity=None, recompute_method=None,
                    recompute_num_layers=None, activation_checkpoint=recompute,
                    compile=compiled)
    notes.append(f"framework=torchtitan: dp_shard={dp_shard}, activation_checkpoint="
                 f"{recompute}, compile={compiled}, async TP={par.tp_comm_overlap}, "
                 f"schedule={schedule}")
    return RunSpec(model=spec.model, parallel=par, train=train, cluster=spec.cluster,
                   framework="torchtitan")


def titan_checkpoint(cell: str, notes: list[str]) -> str:
    """torchtitan's activation-checkpoint mode for a recompute cell: ``none``, ``full``,
    or ``selective`` (torchtitan's op-level SAC, ``selective_ac_option='op'``: labels such
    as ``selective(per-op)``, ``op``, ``SAC``). A cell naming megatron-core modules has no
    torchtitan meaning beyond its granularity, which is said."""
    kwargs, how = read_recompute(cell or "none")
    mode = kwargs.get("recompute_granularity") or "none"
    if mode == "full" and kwargs.get("recompute_method") == "block":
        raise ValueError(f"recompute {cell!r}: torchtitan's full activation checkpointing "
                         "covers every layer (no per-layer count)")
    if kwargs.get("recompute_modules"):
        notes.append(f"recompute {cell!r}: torchtitan's selective policy is op-level; the "
                     "modules named are not a torchtitan setting")
    elif how and mode != "none":
        notes.append(f"recompute {cell!r} read as torchtitan's {mode} activation "
                     "checkpointing")
    return mode
