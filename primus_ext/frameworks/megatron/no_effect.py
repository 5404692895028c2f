"""Megatron-LM flags accepted with no effect on projected step time or memory.

No MoE, dispatcher, MTP or CUDA-graph flag is here: each is modelled (``table.py``) or
reported as "not modelled, may change step time" (router numerics and auxiliary losses
add kernels to every MoE layer; tests/frameworks/test_no_effect_flags.py checks the
lists Megatron-LM core_v0.16.1 and main define).

Grouped by reason; the launcher prints them on one "no effect" line. Flags that change
kernels, memory or collectives but are not modelled are listed too (``_NOT_MODELLED``,
each with its reason, checked against megatron-core 0.16.1's source) and reported on the
"not modelled, may change step time" line with that reason. A flag in none of these lists
nor the flag table (``table.py``) is reported as "not modelled, may change step time",
and so is a modelled flag given a value the model does not cover.
"""
from __future__ import annotations

_REASONS = {
    "data, tokenizer files and data loading (off the step's critical path)": (
        "--data-path --split --data-cache-path --mock-data --num-workers --dataloader-type "
        "--no-mmap-bin-files --no-create-attention-mask-in-dataloader --merge-file "
        "--tiktoken-pattern --train-data-path --valid-data-path --test-data-path "
        "--data-args-path --per-split-data-args-path --reset-position-ids "
        "--reset-attention-mask --eod-mask-loss --seed --legacy-tokenizer "
        "--num-dataset-builder-threads --dataset --train-mode --max-padding-length"),
    # GPTDataset's create_attention_mask: without this flag the dataloader builds an
    # s x s bool mask per sample that pretrain_gpt.py moves to the GPU (TE's causal
    # attention ignores it); the memory model counts no such mask, which is what this
    # flag gives.
    "no dataloader attention mask: what the memory model counts": (
        "--no-create-attention-mask-in-dataloader"),
    "learning rate, schedule, regularisation and loss scaling (same kernels and bytes)": (
        "--lr --min-lr --lr-decay-style --lr-decay-iters --lr-decay-samples "
        "--lr-warmup-fraction --lr-warmup-iters --lr-warmup-samples --lr-warmup-init "
        "--decoupled-lr --decoupled-min-lr --weight-decay --start-weight-decay "
        "--end-weight-decay --weight-decay-incr-style --clip-grad --adam-beta1 --adam-beta2 "
        "--adam-eps --sgd-momentum --init-method-std --loss-scale --initial-loss-scale "
        "--min-loss-scale --loss-scale-window --hysteresis --train-samples "
        "--exit-duration-in-mins --exit-interval --finetune --override-opt_param-scheduler "
        "--use-checkpoint-opt_param-scheduler"),
    "checkpointing (outside the training step)": (
        "--save --load --save-interval --ckpt-format --no-save-optim --no-save-rng "
        "--no-load-optim --no-load-rng --auto-detect-ckpt-format --dist-ckpt-strictness "
        "--use-checkpoint-args --exit-on-missing-checkpoint --no-ckpt-fully-parallel-save "
        "--ckpt-fully-parallel-load --async-save --use-dist-ckpt --pretrained-checkpoint"),
    "logging, evaluation and profiling (outside the step or per-iteration scalars)": (
        "--log-interval --eval-interval --eval-iters --tensorboard-dir --wandb-project "
        "--wandb-exp-name --wandb-save-dir --log-throughput --log-timers-to-tensorboard "
        "--log-memory-to-tensorboard "
        "--log-validation-ppl-to-tensorboard --logging-level "
        "--profile --profile-step-start --profile-step-end --profile-ranks "
        "--use-pytorch-profiler --memory-snapshot-path "
        "--log-progress --tensorboard-log-interval --tensorboard-queue-size "
        "--no-log-loss-scale-to-tensorboard --log-batch-size-to-tensorboard"),
    "process setup and host-side housekeeping (initialisation, export and "
    "post-training builders; --manual-gc: no Python GC pauses, which the projection "
    "counts none of either way)": (
        "--distributed-backend --distributed-timeout-minutes --use-mcore-models "
        "--enable-experimental --manual-gc --manual-gc-interval --no-check-for-nan-in-loss-"
        "and-grad --init-model-with-meta-device "
        "--no-async-tensor-model-parallel-allreduce --use-cpu-initialization "
        "--no-initialization --enable-gpt-oss --export-force-local-attention "
        "--exit-signal-handler --trigger-path"),
    "numerics of the same kernels (same FLOPs and bytes)": (
        "--norm-epsilon --apply-layernorm-1p --rotary-base "
        "--rotary-scaling-factor --rotary-seq-len-interpolation-factor --rope-type "
        "--mscale --mscale-all-dim --glu-linear-offset --activation-func-clamp-value "
        "--use-rope-scaling --rope-scaling-factor "
        "--apply-query-key-layer-scaling --fp8-amax-history-len "
        "--fp8-amax-compute-algo --fp8-margin --fp8-interval "
        "--bf16-reduced-precision-matmul --te-rng-tracker --muon-momentum "
        "--muon-use-nesterov --muon-scale-mode --muon-extra-scale-factor"),
}

# Flags that change kernels, memory or collectives and are not modelled: each is
# reported on the "not modelled, may change step time" line with its reason (a value
# in ``_DEFAULT_VALUES`` is Megatron-LM's default and has no effect).
_NOT_MODELLED = {
    "unfused elementwise kernels (separate bias, activation, dropout and RoPE kernels; "
    "the projection counts them fused)": (
        "--no-bias-gelu-fusion --no-bias-dropout-fusion --no-bias-swiglu-fusion "
        "--no-rope-fusion"),
    "NCCL user buffers (zero-copy, fewer-SM collectives; the collectives are timed at "
    "NCCL's default copy-engine rates)": "--use-nccl-ub --fsdp-manual-registration",
    "Megatron-FSDP's second all-gather buffer (memory not counted)": "--fsdp-double-buffer",
    "torch.cuda.empty_cache() every iteration (allocator churn; the projection reports "
    "the allocated peak)": "--empty-unused-memory-level",
    "attention with sink logits (off-by-one/learnable softmax: TE's cuDNN attention "
    "instead of flash)": "--softmax-type",
    "cuBLAS without reduced-precision bf16 reductions (may pick other GEMM kernels)":
        "--disable-bf16-reduced-precision-matmul",
    "per-token loss: one more all-reduce of the token count per step": (
        "--calculate-per-token-loss"),
    "Pai-Megatron-Patch's sliding-window attention (the window is read from "
    "--window-size only)": "--sliding-window",
    "timers that synchronise the device (megatron-core timers.py _Timer.start/stop: "
    "torch.cuda.synchronize(); level 2 around every microbatch's forward, backward "
    "and P2P)": "--timing-log-level",
    "the caching allocator's history recorded on every allocation (host time per "
    "malloc/free)": "--record-memory-history",
    "pipeline P2P overlapped in warm-up and flush (the schedule's P2P is timed "
    "without it)": "--overlap-p2p-communication-warmup-flush",
    "Muon's Newton-Schulz work other than 5 iterations on q/k/v blocks of each TP "
    "shard at TF32 (memory/muon.py)": (
        "--muon-num-ns-steps --muon-no-split-qkv --muon-tp-mode --muon-fp32-matmul-prec"),
}
_DEFAULT_VALUES = {"--softmax-type": "vanilla", "--empty-unused-memory-level": "0",
                   "--muon-num-ns-steps": "5", "--muon-tp-mode": "blockwise",
                   "--muon-fp32-matmul-prec": "medium", "--timing-log-level": "0"}

LISTED_NOT_MODELLED: dict[str, str] = {}
for _why, _names in _NOT_MODELLED.items():
    for _n in _names.split():
        LISTED_NOT_MODELLED[_n] = _why


def listed_reason(flag: str, value: str | None) -> str | None:
    """The reason a listed flag is not modelled; None at Megatron-LM's default value."""
    if flag in _DEFAULT_VALUES and _DEFAULT_VALUES[flag] == value:
        return None
    return LISTED_NOT_MODELLED.get(flag)

NO_EFFECT: dict[str, str] = {}
for _why, _names in _REASONS.items():
    for _n in _names.split():
        NO_EFFECT[_n] = _why



def split_unknown(unknown: list[str], not_modelled: list[str]
                  ) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(not modelled, no effect) among the tokens the flag table did not read: the
    parse's own not-modelled values first, then each flag once, a listed one with its
    reason."""
    values: dict[str, str | None] = {}
    for i, t in enumerate(unknown):
        if t.startswith("--"):
            nxt = unknown[i + 1] if i + 1 < len(unknown) else None
            v = t.split("=", 1)[1] if "=" in t else \
                (nxt if nxt is not None and not nxt.startswith("--") else None)
            values.setdefault(t.split("=", 1)[0], v)
    no_eff, not_mod = [], list(not_modelled)
    for x, v in values.items():
        if x in NO_EFFECT:
            no_eff.append(x)
        elif x in LISTED_NOT_MODELLED:
            why = listed_reason(x, v)
            if why:
                not_mod.append(f"{x} ({why})")
            else:
                no_eff.append(x)
        else:
            not_mod.append(x)
    return tuple(not_mod), tuple(no_eff)
