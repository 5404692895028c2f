"""Megatron-LM flags accepted with no effect on projected step time or memory.

No MoE, dispatcher, MTP or CUDA-graph flag is here: each is modelled (``table.py``) or
reported as "not modelled, may change step time" (router numerics and auxiliary losses
add kernels to every MoE layer; tests/frameworks/test_no_effect_flags.py checks the
lists Megatron-LM core_v0.16.1 and main define).

Grouped by reason; the launcher prints them on one "no effect" line. A flag that is in
neither this list nor the flag table (``table.py``) is reported as "not modelled, may
change step time", and so is a modelled flag given a value the model does not cover.
"""
from __future__ import annotations

_REASONS = {
    "data, tokenizer files and data loading (off the step's critical path)": (
        "--data-path --split --data-cache-path --mock-data --num-workers --dataloader-type "
        "--no-mmap-bin-files --no-create-attention-mask-in-dataloader --merge-file "
        "--tiktoken-pattern --train-data-path --valid-data-path --test-data-path "
        "--data-args-path --per-split-data-args-path --reset-position-ids "
        "--reset-attention-mask --eod-mask-loss --seed --legacy-tokenizer"),
    "learning rate, schedule, regularisation and loss scaling (same kernels and bytes)": (
        "--lr --min-lr --lr-decay-style --lr-decay-iters --lr-decay-samples "
        "--lr-warmup-fraction --lr-warmup-iters --lr-warmup-samples --lr-warmup-init "
        "--decoupled-lr --decoupled-min-lr --weight-decay --start-weight-decay "
        "--end-weight-decay --weight-decay-incr-style --clip-grad --adam-beta1 --adam-beta2 "
        "--adam-eps --sgd-momentum --init-method-std --loss-scale --initial-loss-scale "
        "--min-loss-scale --loss-scale-window --hysteresis --train-samples "
        "--exit-duration-in-mins --exit-interval --finetune --override-opt_param-scheduler "
        "--use-checkpoint-opt_param-scheduler --calculate-per-token-loss "
        "--rampup-batch-size --step-batch-size-schedule"),
    "checkpointing (outside the training step)": (
        "--save --load --save-interval --ckpt-format --no-save-optim --no-save-rng "
        "--no-load-optim --no-load-rng --auto-detect-ckpt-format --dist-ckpt-strictness "
        "--use-checkpoint-args --exit-on-missing-checkpoint --no-ckpt-fully-parallel-save "
        "--ckpt-fully-parallel-load --async-save --use-dist-ckpt --pretrained-checkpoint"),
    "logging, evaluation and profiling (outside the step or per-iteration scalars)": (
        "--log-interval --eval-interval --eval-iters --tensorboard-dir --wandb-project "
        "--wandb-exp-name --wandb-save-dir --log-throughput --log-timers-to-tensorboard "
        "--log-memory-to-tensorboard "
        "--log-validation-ppl-to-tensorboard --logging-level --timing-log-level "
        "--profile --profile-step-start --profile-step-end --profile-ranks "
        "--use-pytorch-profiler --record-memory-history --memory-snapshot-path "
        "--log-progress --tensorboard-log-interval"),
    "process setup and host-side housekeeping": (
        "--distributed-backend --distributed-timeout-minutes --use-mcore-models "
        "--enable-experimental --manual-gc --manual-gc-interval --no-check-for-nan-in-loss-"
        "and-grad --empty-unused-memory-level --init-model-with-meta-device "
        "--no-async-tensor-model-parallel-allreduce --use-cpu-initialization "
        "--no-initialization --disable-bf16-reduced-precision-matmul --enable-gpt-oss "
        "--export-force-local-attention --fsdp-manual-registration --use-nccl-ub"),
    "numerics of the same kernels (same FLOPs and bytes)": (
        "--norm-epsilon --apply-layernorm-1p --rotary-base --rotary-percent "
        "--rotary-scaling-factor --rotary-seq-len-interpolation-factor --rope-type "
        "--mscale --mscale-all-dim --glu-linear-offset --activation-func-clamp-value "
        "--softmax-type --apply-query-key-layer-scaling --fp8-amax-history-len "
        "--fp8-amax-compute-algo --fp8-margin --fp8-interval "
        "--bf16-reduced-precision-matmul"),
    "kernel fusions of elementwise ops the projection already counts as fused, and "
    "FSDP's double-buffered all-gathers": (
        "--no-bias-gelu-fusion --no-bias-dropout-fusion "
        "--no-rope-fusion --fsdp-double-buffer --te-rng-tracker"),
}

NO_EFFECT: dict[str, str] = {}
for _why, _names in _REASONS.items():
    for _n in _names.split():
        NO_EFFECT[_n] = _why
