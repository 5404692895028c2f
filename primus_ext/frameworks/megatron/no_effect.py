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
        "--num-dataset-builder-threads --dataset --train-mode --max-padding-length "
        "--allow-ambiguous-pad-tokens --dataloader-defer-npy-index-mmap "
        "--dataloader-fast-cache-load --fim-data --fim-eod-token --fim-fragment-rate "
        "--fim-middle-token --fim-no-prefix --fim-pad-token --fim-prefix-token --fim-rate "
        "--fim-split-sample --fim-spm-rate --fim-suffix-token --mid-level-dataset-surplus "
        "--no-data-sharding --per-dataset-sequences-path --sample-rate "
        "--tiktoken-num-special-tokens --tiktoken-special-tokens "
        "--tokenizer-hf-include-special-tokens --tokenizer-hf-use-fast --tokenizer-metadata "
        "--tokenizer-sentencepiece-legacy --tokenizer-special-tokens"),
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
        "--use-checkpoint-opt_param-scheduler --head-lr-mult --apply-wd-to-qk-layernorm "
        "--no-weight-decay-cond-type --lr-wsd-decay-iters --lr-wsd-decay-samples "
        "--lr-wsd-decay-style --override-opt-param-scheduler "
        "--use-checkpoint-opt-param-scheduler"),
    "checkpointing (outside the training step)": (
        "--save --load --save-interval --ckpt-format --no-save-optim --no-save-rng "
        "--no-load-optim --no-load-rng --auto-detect-ckpt-format --dist-ckpt-strictness "
        "--use-checkpoint-args --exit-on-missing-checkpoint --no-ckpt-fully-parallel-save "
        "--ckpt-fully-parallel-load --async-save --use-dist-ckpt --pretrained-checkpoint "
        "--ckpt-fully-parallel-save --dist-ckpt-format --ckpt-assume-constant-structure "
        "--ckpt-convert-format --ckpt-convert-save --ckpt-convert-update-legacy-dist-opt-format "
        "--ckpt-step --dist-ckpt-optim-fully-reshardable --dist-ckpt-save-pre-mcore-014 "
        "--distrib-optim-fully-reshardable-mem-efficient --disable-ckpt-fully-parallel-save "
        "--disable-strict-fsdp-dtensor-load --no-strict-fsdp-dtensor-load "
        "--load-main-params-from-ckpt --non-persistent-ckpt-type "
        "--non-persistent-global-ckpt-dir --non-persistent-local-ckpt-algo "
        "--non-persistent-local-ckpt-dir --non-persistent-save-interval "
        "--persistent-save-interval --save-retain-interval --use-persistent-ckpt-worker "
        "--use-mp-args-from-checkpoint-args --disable-use-tokenizer-model-from-checkpoint-args "
        "--no-use-tokenizer-model-from-checkpoint-args --replication --replication-factor "
        "--replication-jump"),
    "logging, evaluation and profiling (outside the step or per-iteration scalars)": (
        "--log-interval --eval-interval --eval-iters --tensorboard-dir --wandb-project "
        "--wandb-exp-name --wandb-save-dir --log-throughput --log-timers-to-tensorboard "
        "--log-memory-to-tensorboard "
        "--log-validation-ppl-to-tensorboard --logging-level "
        "--profile --profile-step-start --profile-step-end --profile-ranks "
        "--use-pytorch-profiler --memory-snapshot-path "
        "--log-progress --tensorboard-log-interval --tensorboard-queue-size "
        "--no-log-loss-scale-to-tensorboard --log-batch-size-to-tensorboard "
        "--config-logger-dir --disable-log-loss-scale-to-tensorboard --log-device-memory-used "
        "--log-energy --log-memory-interval --log-straggler --log-world-size-to-tensorboard "
        "--wandb-entity --disable-straggler-on-startup --straggler-ctrlr-port "
        "--straggler-minmax-count --no-barrier-with-level-1-timing --timing-log-option "
        "--help --save-dgrads-interval --save-wgrads-interval "
        "--full-validation "
        "--multiple-validation-sets"),
    "process setup and host-side housekeeping (initialisation, export and "
    "post-training builders; --manual-gc: Python's collections run on every rank at "
    "the same iteration instead of at each rank's own time; the unsynchronised host "
    "pauses the projection charges FSDP groups (project/host_pauses.py) show in "
    "torchtitan's GC-aligned runs as in the others, so it changes none of them)": (
        "--distributed-backend --distributed-timeout-minutes --use-mcore-models "
        "--enable-experimental --manual-gc --manual-gc-interval --no-check-for-nan-in-loss-"
        "and-grad --init-model-with-meta-device "
        "--no-async-tensor-model-parallel-allreduce --use-cpu-initialization "
        "--no-initialization --enable-gpt-oss --export-force-local-attention "
        "--exit-signal-handler --trigger-path --adlr-autoresume --adlr-autoresume-interval "
        "--app-tag-run-name --app-tag-run-version --no-one-logger --one-logger-async "
        "--one-logger-project --one-logger-run-name --calc-ft-timeouts --enable-ft-package "
        "--ft-num-warmup-iters --inprocess-active-world-size --inprocess-barrier-timeout "
        "--inprocess-completion-timeout --inprocess-empty-cuda-cache --inprocess-granularity "
        "--inprocess-hard-timeout --inprocess-heartbeat-interval --inprocess-heartbeat-timeout "
        "--inprocess-last-call-wait --inprocess-max-iterations "
        "--inprocess-monitor-process-interval --inprocess-monitor-thread-interval "
        "--inprocess-progress-watchdog-interval --inprocess-restart --inprocess-soft-timeout "
        "--inprocess-termination-grace-time --local-rank --lazy-mpu-init --fake-process-group "
        "--distributed-timeout-seconds-after-init --disable-gloo-process-groups "
        "--run-workload-inspector-server --result-rejected-tracker-filename "
        "--dump-param-to-param-group-map --max-tokens-to-oom "
        "--init-method-xavier-uniform --phase-transition-iterations --disable-msc "
        "--object-storage-cache-path --exit-signal --exit-signal-handler-for-dataloader "
        "--error-injection-rate --error-injection-type --rerun-mode --skip-train --test-mode "
        "--iterations-to-skip --check-for-spiky-loss --disable-manual-gc-eval "
        "--no-manual-gc-eval --trust-remote-code --data-parallel-random-init "
        "--embedding-init-method-std --disable-async-tensor-model-parallel-allreduce"),
    # Flags of Megatron-LM's other entry points (BERT, T5, vision, retrieval, RL/GRPO,
    # inference and SFT): pretrain_gpt.py accepts them and its GPT step does not use them.
    "other entry points' flags (BERT, T5, vision, retrieval, RL, inference, SFT), "
    "unused by pretrain_gpt.py's step": (
        "--bert-embedder-type --bert-load --bert-no-binary-head --biencoder-projection-dim "
        "--biencoder-shared-query-context-model --block-data-path --classes-fraction "
        "--data-per-class-fraction --dino-bottleneck-size --dino-freeze-last-layer "
        "--dino-head-hidden-size --dino-local-crops-number --dino-local-img-size "
        "--dino-norm-last-layer --dino-teacher-temp --dino-warmup-teacher-temp "
        "--dino-warmup-teacher-temp-epochs --embedding-path --evidence-data-path --ict-head-size "
        "--ict-load --img-h --img-w --indexer-batch-size --indexer-log-interval --iter-per-epoch "
        "--mask-factor --mask-prob --mask-type --num-channels --num-classes "
        "--output-bert-embeddings --patch-dim --query-in-block-prob "
        "--retriever-report-topk-accuracies --retriever-score-scaling --short-seq-prob "
        "--swin-backbone-type --titles-data-path --use-one-sent-docs --vision-backbone-type "
        "--vision-pretraining --vision-pretraining-type --vocab-extra-ids "
        "--relative-attention-max-distance --relative-attention-num-buckets "
        "--encoder-num-layers --encoder-seq-length --decoder-num-layers --decoder-seq-length "
        "--sft --sft-tokenizer-prompt-format --cache-mla-latents "
        "--disable-chunked-prefill --enable-chunked-prefill "
        "--inference-batch-times-seqlen-threshold --inference-dynamic-batching "
        "--inference-dynamic-batching-block-size --inference-dynamic-batching-buffer-size-gb "
        "--inference-dynamic-batching-max-requests --inference-dynamic-batching-max-tokens "
        "--inference-dynamic-batching-paused-buffer-size-gb "
        "--inference-dynamic-batching-track-paused-request-events "
        "--inference-dynamic-batching-unified-memory-level --inference-logging-step-interval "
        "--inference-max-batch-size --inference-max-requests --inference-max-seq-length "
        "--inference-wandb-logging --nccl-all-reduce-for-prefill --use-legacy-static-engine "
        "--grpo-clamp-eps-lower "
        "--grpo-clamp-eps-upper --grpo-entropy-term-weight --grpo-filter-groups-with-same-reward "
        "--grpo-group-size --grpo-iterations --grpo-kl-beta --grpo-prompts-per-step "
        "--langrl-env-config --langrl-external-server "
        "--langrl-inference-server-conversation-template --langrl-inference-server-type "
        "--perform-rl-step --refit-method --rl-default-temperature --rl-default-top-k "
        "--rl-default-top-p --rl-importance-sampling-truncation-coef "
        "--rl-inference-logprobs-is-correction "
        "--rl-inference-model-unified-memory-level --rl-inference-pipeline-model-parallel-size "
        "--rl-inference-tensor-model-parallel-size --rl-offload-inference-model-weights-when-idle "
        "--rl-offload-kv-cache-during-training --rl-offload-optimizer-during-inference "
        "--rl-parallel-generation-tasks --rl-partial-rollouts --rl-prompts-per-eval "
        "--rl-remove-kv-cache-during-training "
        "--rl-sequence-packing-algo --rl-sequence-packing-max-sequences-per-bin "
        "--rl-skip-bos-token  --rl-use-sequence-packing "
        "--rl-verify-model-weights-swap --no-rl-inference-logprobs-is-correction "
        "--no-rl-offload-inference-model-weights-when-idle "
        "--no-rl-offload-kv-cache-during-training --no-rl-partial-rollouts "
        "--no-rl-remove-kv-cache-during-training "
        "--no-rl-skip-bos-token  --no-rl-use-sequence-packing "
        "--no-rl-verify-model-weights-swap --no-langrl-external-server "
        "--no-inference-wandb-logging --inference-coordinator-port "
        "--inference-fuse-tp-communication --inference-rng-tracker --flash-decode "
        "--mlp-chunks-for-prefill --disable-mamba-mem-eff-path"),
    "numerics of the same kernels (same FLOPs and bytes)": (
        "--norm-epsilon --apply-layernorm-1p --rotary-base "
        "--rotary-scaling-factor --rotary-seq-len-interpolation-factor --rope-type "
        "--mscale --mscale-all-dim --glu-linear-offset "
        "--use-rope-scaling --rope-scaling-factor "
        "--apply-query-key-layer-scaling --fp8-amax-history-len "
        "--fp8-amax-compute-algo --fp8-margin --fp8-interval "
        "--bf16-reduced-precision-matmul --te-rng-tracker --rotary-interleaved "
        "--mrope-section --apply-residual-connection-post-layernorm --muon-momentum "
        "--muon-scale-mode --muon-extra-scale-factor"),
}

# Flags that change kernels, memory or collectives and are not modelled: each is
# reported on the "not modelled, may change step time" line with its reason (a value
# in ``_DEFAULT_VALUES`` is Megatron-LM's default and has no effect).
_NOT_MODELLED = {
    "unfused elementwise kernels (separate bias, activation and dropout kernels; "
    "the projection counts them fused)": (
        "--no-bias-gelu-fusion --no-bias-dropout-fusion --no-bias-swiglu-fusion"),
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
    "DDP bucketing and gradient reduction other than megatron-core's defaults (bucket "
    "size, bucket count, padding, averaging in the collective, fp32 reduce-scatter "
    "accumulation, the fused division, chunk 0's gather dispatched in the optimizer step)": (
        "--ddp-bucket-size --ddp-num-buckets --ddp-pad-buckets-for-high-nccl-busbw "
        "--ddp-average-in-collective --ddp-reduce-scatter-with-fp32-accumulation "
        "--no-gradient-reduce-div-fusion "
        "--overlap-param-gather-with-optimizer-step --suggested-communication-unit-size"),
    "collective setup (SHARP, NCCL communicator configs, symmetric memory, extra "
    "all-gather groups, high-priority streams)": (
        "--use-sharp --sharp-enabled-group --nccl-communicator-config-path "
        "--disable-symmetric-registration --create-all-gather-group "
        "--high-priority-stream-groups --use-tp-pp-dp-mapping --tp-comm-overlap-cfg"),
    "FSDP variants (HSDP's outer sharding)": (
        "--enable-full-sharding-in-hsdp --outer-dp-sharding-strategy"),
    "optimizer offloading to the host (memory and host copies)": (
        "--optimizer-cpu-offload --optimizer-offload-fraction --overlap-cpu-optimizer-d2h-h2d "
        "--use-torch-optimizer-for-cpu-offload --no-pin-cpu-grads --no-pin-cpu-params"),
    "kernels other than the ones counted (no JIT fusion, no persistent LayerNorm, "
    "OpenAI's GeLU, fp16 logits in the loss, no P2P overlap, TE/Kitchen precision "
    "configs)": (
        "--disable-jit-fuser --no-persist-layer-norm --openai-gelu --fp16-lm-cross-entropy "
        "--no-overlap-p2p-communication --no-scatter-gather-tensors-in-pipeline "
        "--no-rope-freq --onnx-safe --te-precision-config-file --kitchen-config-file "
        "--kitchen-recipe-number"),
    "a batch decreased to a multiple of micro x DP (the projection keeps the batch "
    "given, or refuses it)": "--decrease-batch-size-if-needed",
    "a host-device synchronisation every N iterations (CPU run-ahead bounded)": (
        "--train-sync-interval"),
    "Tensor-parallel communication overlap variants (bulk/split/pipelined overlaps "
    "turned off, its bootstrap backend)": (
        "--disable-tp-comm-bulk-dgrad --disable-tp-comm-bulk-wgrad "
        "--disable-tp-comm-overlap-ag --disable-tp-comm-overlap-rs --disable-tp-comm-split-ag "
        "--disable-tp-comm-split-rs --no-tp-comm-bulk-dgrad --no-tp-comm-bulk-wgrad "
        "--no-tp-comm-overlap-ag --no-tp-comm-overlap-rs --no-tp-comm-split-ag "
        "--no-tp-comm-split-rs --tp-comm-overlap-rs-dgrad --tp-comm-bootstrap-backend"),
    "memory placement not counted (no clone of the embedding's scatter output, "
    "activations distributed over TP, early release of attention memory, fp32 "
    "residuals, the offloading threshold)": (
        "--disable-clone-scatter-output-in-embedding --no-clone-scatter-output-in-embedding "
        "--distribute-saved-activations --ep-overlap-early-attn-memory-release "
        "--fp32-residual-connection --min-offloaded-tensor-size"),
    "precision variants (bf16 weight gradients under FP8, bf16 first/last layers, FP4, "
    "custom quantizers)": (
        "--disable-fp8-wgrad --no-fp8-wgrad --first-last-layers-bf16 "
        "--num-layers-at-start-in-bf16 --num-layers-at-end-in-bf16 --fp4-format "
        "--fp4-param-gather --fp4-quantizer-factory --fp4-recipe --fp8-quantizer-factory"),
    "context parallelism variants (hierarchical, hybrid)": (
        "--hierarchical-context-parallel-sizes --hybrid-context-parallel "
        "--max-seqlen-per-dp-cp-rank"),
    "attention and activation variants that add or change kernels (output gate, "
    "sparse-attention indexer, experimental variants, QK L2 norm, batch-invariant "
    "kernels, Kitchen attention, TE or fused activations, max-logit logging, QK clip)": (
        "--attention-output-gate --dsa-indexer-head-dim --dsa-indexer-loss-coeff "
        "--dsa-indexer-n-heads --dsa-indexer-topk --dsa-indexer-use-sparse-loss "
        "--experimental-attention-variant --qk-l2-norm --batch-invariant-mode "
        "--kitchen-attention-backend --use-kitchen-attention "
        "--use-fused-weighted-squared-relu --use-te-activation-func "
        "--log-max-attention-logit --qk-clip --qk-clip-alpha --qk-clip-threshold"),
    "MoE variants not modelled (probabilities on the input, the legacy DeepEP switch, "
    "routing replay, extended TP, latent experts, MoE layer recompute, shared-expert "
    "gate, token dropping, standalone MTP)": (
        "--moe-apply-probs-on-input --moe-enable-deepep "
        "--moe-enable-routing-replay --moe-extended-tp "
        "--moe-latent-size --moe-layer-recompute --moe-shared-expert-gate "
        "--moe-token-drop-policy --mtp-standalone"),
    "pipeline P2P backends (ring exchange, another communication backend)": (
        "--use-ring-exchange-p2p --pipeline-model-parallel-comm-backend"),
    "symmetric-memory all-reduce": "--symmetric-ar-type",
    "CUDA graphs and expert layouts of the inference and RL entry points": (
        "--decode-only-cuda-graphs --inference-dynamic-batching-cuda-graph-max-tokens "
        "--inference-dynamic-batching-cuda-graph-mixed-prefill-count "
        "--inference-dynamic-batching-num-cuda-graphs "
        "--moe-pad-experts-for-cuda-graph-inference --no-rl-reset-cuda-graphs "
        "--no-rl-training-cuda-graphs --rl-inference-expert-model-parallel-size "
        "--rl-inference-expert-tensor-model-parallel-size --rl-reset-cuda-graphs "
        "--rl-training-cuda-graphs"),
    "a check of every step's gradients for large values (extra reductions and a host "
    "synchronisation)": "--check-for-large-grads",
    "FP8 buffers kept or reused (the FP8 transpose cache, the MXFP8 gradient buffer)": (
        "--keep-fp8-transpose-cache --reuse-grad-buf-for-mxfp8-param-ag"),
    "a model or arguments from a file or module the projection does not read (a "
    "custom layer spec, heterogeneous layers, YAML arguments, legacy models, "
    "upcycling, linear attention)": (
        "--spec --heterogeneous-layers-config-path --heterogeneous-layers-config-encoded-json "
        "--yaml-cfg --use-legacy-models --moe-use-upcycling --moe-upcycling-granularity "
        "--linear-attention-freq --linear-conv-kernel-dim --linear-key-head-dim "
        "--linear-num-key-heads --linear-num-value-heads --linear-value-head-dim"),
    "pipeline P2P overlapped in warm-up and flush (the schedule's P2P is timed "
    "without it)": "--overlap-p2p-communication-warmup-flush",
    "flags of Megatron-LM's dev branch (d48bd6be0a, 2026-08-21) that neither "
    "core_v0.16.1 nor main has: optimizer states offloaded to host memory between steps "
    "(the memory model keeps them on the device, the copies are not costed), offloading "
    "held back until CUDA-graph capture, separate pipeline send/receive groups": (
        "--offload-optimizer-states --delay-offload-until-cuda-graph "
        "--use-separate-send-recv-groups"),
    "Muon's step other than 5 Newton-Schulz iterations in BF16 on the q/k/v blocks "
    "of each TP shard, without Nesterov momentum (project/muon_step.py)": (
        "--muon-num-ns-steps --muon-no-split-qkv --muon-tp-mode --muon-fp32-matmul-prec "
        "--muon-use-nesterov"),
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


def is_known(flag: str) -> bool:
    """Whether a flag is read (the flag table) or listed: no effect, or not modelled
    with its reason."""
    from primus_ext.frameworks.megatron.table import BY_NAME
    return flag in BY_NAME or flag in NO_EFFECT or flag in LISTED_NOT_MODELLED
