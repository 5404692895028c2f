#!/usr/bin/env bash
# Example: project a Llama 3.1 70B run on 8 nodes of 8 H100 from the GPUs (or CPU cores)
# of this machine, with the same flags a Megatron-LM launch would use. Drop the last
# line (--project-only ...) and point MEGATRON at Megatron-LM's pretrain_gpt.py to train.
#   NPROC=2 launch/run_local.sh [extra Megatron-LM flags]
set -euo pipefail
cd "$(dirname "$0")/.."
NPROC=${NPROC:-2}
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
[ -z "${OMP_NUM_THREADS:-}" ] && export OMP_NUM_THREADS=1
exec $PY -m torch.distributed.run --standalone --nproc-per-node "$NPROC" \
  launch/pretrain_gpt.py \
  --num-layers 80 --hidden-size 8192 --ffn-hidden-size 28672 --num-attention-heads 64 \
  --group-query-attention --num-query-groups 8 --swiglu --normalization RMSNorm \
  --position-embedding-type rope --disable-bias-linear --untie-embeddings-and-output-weights \
  --seq-length 8192 --max-position-embeddings 131072 --micro-batch-size 1 \
  --global-batch-size 512 --bf16 --tensor-model-parallel-size 8 --sequence-parallel \
  --pipeline-model-parallel-size 4 --num-layers-per-virtual-pipeline-stage 5 \
  --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather \
  --mock-data --tokenizer-type NullTokenizer --vocab-size 128255 \
  --hidden-dropout 0 --attention-dropout 0 --train-iters 100 \
  --data-path /data/unused --save /ckpt/unused --log-interval 1 "$@" \
  --project-only --target-nodes 8 --target-gpus-per-node 8 --target-hardware h100
