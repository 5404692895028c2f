"""Megatron-LM launch-line rules read as Megatron-LM reads them (pure): the entry point,
the batch schedule, the fused cross entropy's kernel, group-limited routing and the
optimizer. Each function takes the parsed namespace and the parse's ``Notes``.
"""
from __future__ import annotations

# Flags of Megatron-LM's other models (pretrain_mamba.py: MambaModel and hybrid stacks;
# megatron/training/arguments.py _add_mamba_args / the hybrid pattern flags).
_OTHER_MODELS = ("--hybrid-override-pattern", "--hybrid-layer-pattern",
                 "--hybrid-attention-ratio", "--hybrid-mlp-ratio",
                 "--mtp-hybrid-override-pattern", "--is-hybrid-model", "--mamba-state-dim",
                 "--mamba-head-dim", "--mamba-num-groups", "--mamba-num-heads")
_ENTRY_POINTS = ("pretrain_mamba.py", "pretrain_hybrid.py", "pretrain_t5.py",
                 "pretrain_bert.py", "pretrain_vlm.py", "pretrain_retro.py")
COVERS = ("primus-ext projects Megatron-LM's pretrain_gpt.py models (GPTModel: dense and "
          "MoE transformer decoders, with GQA, MLA, MTP and sliding windows)")


# Megatron-LM core_v0.16.1 validate_args refuses these ('Deprecated arguments').
DEPRECATED = {
    "--batch-size": "--batch-size argument is no longer valid, use --micro-batch-size instead",
    "--warmup": "--warmup argument is no longer valid, use --lr-warmup-fraction instead",
    "--model-parallel-size": "--model-parallel-size is no longer valid, use "
                             "--tensor-model-parallel-size instead",
    "--checkpoint-activations": "--checkpoint-activations is no longer valid, use "
                                "--recompute-activations, or, for more control, "
                                "--recompute-granularity and --recompute-method.",
}
REFUSED = frozenset(_OTHER_MODELS) | frozenset(DEPRECATED)


def refuse_other_models(argv: list[str]) -> None:
    """One line for a launch line of another Megatron-LM model, before argparse asks for
    flags such a line need not have (a hybrid pattern sets the layer count)."""
    for tok in argv:
        name = tok.split("=", 1)[0]
        what = None
        if name in DEPRECATED:
            raise ValueError(f"{name}: Megatron-LM refuses it ('{DEPRECATED[name]}')")
        if name in _OTHER_MODELS:
            what = f"{name} is a Mamba/hybrid model flag (pretrain_mamba.py)"
        elif tok.rsplit("/", 1)[-1] in _ENTRY_POINTS:
            what = f"{tok} is another entry point"
        if what:
            raise ValueError(f"{what}: {COVERS}; Mamba, hybrid and other models are not "
                             "covered")


def _final_batch(schedule: str) -> tuple[int, int]:
    """(final batch, entries) of a --step-batch-size-schedule (Megatron-LM main,
    megatron/core/num_microbatches_calculator.py StepBatchsizeNumMicroBatchesCalculator:
    'THRESHOLD:BS' entries split on spaces or commas, K/M/B/T suffixes, sorted by
    threshold; the first threshold is 0; the global batch is the last entry's)."""
    mult = {"K": 10**3, "M": 10**6, "B": 10**9, "T": 10**12}

    def num(s: str) -> int:
        s = s.strip().upper()
        m = mult.get(s[-1:], 1)
        return int(float(s[:-1] if m != 1 else s) * m)

    entries = []
    for e in schedule.replace(",", " ").split():
        if ":" not in e:
            raise ValueError(f"--step-batch-size-schedule entry {e!r}: expected "
                             "THRESHOLD:BATCH_SIZE (Megatron-LM)")
        t, b = e.split(":", 1)
        try:
            entries.append((num(t), num(b)))
        except ValueError:
            raise ValueError(f"--step-batch-size-schedule entry {e!r}: not a number "
                             "(K, M, B, T suffixes allowed)") from None
    entries.sort()
    if not entries or entries[0][0] != 0:
        raise ValueError("--step-batch-size-schedule: the first threshold must be 0 "
                         "(Megatron-LM: 'first schedule entry must have threshold 0')")
    if any(b <= 0 for _, b in entries):
        raise ValueError("--step-batch-size-schedule: batch sizes must be positive")
    return entries[-1][1], len(entries)


def global_batch(ns, dp: int, n) -> int:
    """The steady global batch: --global-batch-size, the last entry of
    --step-batch-size-schedule, or micro x DP (Megatron-LM's default). A ramp-up is named
    in a note: the projection is of the steady (final) batch."""
    gbs = ns.global_batch_size
    sched = ns.step_batch_size_schedule
    if sched is not None:
        final, k = _final_batch(" ".join(sched))
        if gbs is not None and gbs != final:
            raise ValueError(f"--step-batch-size-schedule ends at {final} but "
                             f"--global-batch-size is {gbs} (Megatron-LM main: 'Cannot "
                             "specify both --step-batch-size-schedule and "
                             "--global-batch-size')")
        n.notes.append(f"--step-batch-size-schedule {' '.join(sched)}: projected at its "
                       f"steady global batch {final} (the last of its {k} steps; the flag is "
                       "Megatron-LM main's, core_v0.16.1 does not have it)"
                       + (" (Megatron-LM main refuses it beside --global-batch-size)"
                          if gbs is not None else ""))
        return final
    if ns.rampup_batch_size is not None:
        start, inc, samples = ns.rampup_batch_size
        steady = gbs or ns.micro_batch_size * dp
        n.notes.append(f"--rampup-batch-size {start} {inc} {samples}: projected at the "
                       f"steady global batch {steady} (the ramp from {start} by {inc} over "
                       f"{samples} samples is not; Megatron-LM core_v0.16.1 refuses it with "
                       "--train-iters: 'expected no batch-size rampup for iteration-based "
                       "training', main ignores it: deprecated)")
        return steady
    return gbs or ns.micro_batch_size * dp


def cross_entropy(ns, n) -> tuple[bool, str]:
    """(fusion, impl): megatron-core LanguageModule.compute_language_model_loss picks the
    kernel by --cross-entropy-fusion-impl only under --cross-entropy-loss-fusion; without
    it the loss is the unfused vocab_parallel_cross_entropy (fp32 logits copy) whatever
    the impl says."""
    fusion, impl = ns.cross_entropy_loss_fusion, ns.cross_entropy_fusion_impl
    if not fusion and impl != "native":
        n.notes.append(f"--cross-entropy-fusion-impl {impl} without "
                       "--cross-entropy-loss-fusion: the unfused vocab-parallel cross "
                       "entropy runs (megatron-core compute_language_model_loss), its fp32 "
                       "logits copy counted")
        return False, "native"
    if fusion and impl == "te":
        n.notes.append("--cross-entropy-fusion-impl te: Transformer Engine's "
                       "parallel_cross_entropy (the logits' gradient written in the "
                       "forward, no fp32 logits copy); Megatron-LM core_v0.16.1 runs it, "
                       "main refuses it ('disabled due to stability issues')")
    return fusion, impl


def check_optimizer(ns, fsdp: bool, n) -> None:
    """Megatron-LM core_v0.16.1 validate_args ('Muon optimizer check') and megatron-core's
    get_megatron_muon_optimizer: Muon runs without gradient/parameter overlap, FSDP and
    fp16. ``--optimizer muon --use-distributed-optimizer`` is Megatron-LM main's spelling
    of dist_muon (validate_args: 'optimizer=dist_muon is deprecated. Use --optimizer muon
    --use-distributed-optimizer instead'; core_v0.16.1 refuses it): read as dist_muon,
    the namespace set so (``ns`` is changed in place)."""
    if "muon" not in ns.optimizer:
        return
    if ns.use_distributed_optimizer and not fsdp:
        n.notes.append(f"--optimizer {ns.optimizer} --use-distributed-optimizer read as "
                       "dist_muon, Megatron-LM main's layer-wise distributed optimizer "
                       "(core_v0.16.1 refuses it: 'Muon optimizer does not support "
                       "distributed optimizer for now')")
        if ns.use_layer_wise_param_layout:
            n.not_modelled.append("Megatron-LM main's precomputed layer-wise parameter "
                                  "layout (its default with muon and the distributed "
                                  "optimizer; modelled as --no-use-layer-wise-param-layout)")
        ns.optimizer, ns.use_distributed_optimizer = "dist_muon", False
    for on, what in ((ns.overlap_grad_reduce, "overlap grad reduce"),
                     (ns.overlap_param_gather, "overlap param gather"),
                     (fsdp, "FSDP"), (ns.fp16, "fp16")):
        if on:
            raise ValueError(f"--optimizer {ns.optimizer} with {what}: Megatron-LM "
                             "core_v0.16.1 refuses it (validate_args' Muon optimizer "
                             "check; megatron-core get_megatron_muon_optimizer)")


def router_groups(ns, n) -> tuple[int | None, int | None]:
    """(num_groups, group_topk): megatron-core checks and uses the group count only when
    a group top-k is set (transformer_config.py: 'if self.moe_router_group_topk:'; the
    router's group-limited top-k likewise), so a group count alone does nothing."""
    g, gk = ns.moe_router_num_groups, ns.moe_router_group_topk
    if not ns.num_experts:
        return None, None
    if g is not None and not gk:
        n.notes.append(f"--moe-router-num-groups {g} without --moe-router-group-topk: "
                       "plain top-k routing (megatron-core uses groups only with a group "
                       "top-k)")
        return None, None
    if gk and not g:
        raise ValueError("--moe-router-group-topk needs --moe-router-num-groups "
                         "(megatron-core: 'When using group limited routing, "
                         "moe_router_num_groups must be specified.')")
    return g, gk
