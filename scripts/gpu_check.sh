#!/usr/bin/env bash
# The one command that proves the hybrid mode on the device at hand (one GPU, or this CPU).
#
# For each case (CASES, default "dense moe"):
#   1. the megatron-core drop-in, --project-only, hybrid backend: the measurement is
#      planned to fit the device, measured (Transformer Engine spec when it imports on a
#      GPU, CUDA events; megatron-core's local spec on a CPU) and projected for a 1-node
#      target of the local hardware (1 device), so the measured times stand in;
#   2. a real short training of the same line on the same device (ITERS iterations);
#   3. a table: projected against measured step time and memory (CUDA: allocated peak;
#      CPU: the resident-set growth, as a CPU keeps no allocator statistics).
#
# Cases, at SHAPE=real (the default on a GPU):
#   dense: Llama 3 8B at TP 1 (hidden 4096, 32 heads, 8 KV groups, SwiGLU 14336, RoPE,
#          RMSNorm, 128,256 vocabulary), LAYERS layers (default 4) so the real run fits
#          one 80 GB GPU with Adam; seq SEQ (default 4096), 8 microbatches of 1;
#   moe:   a Mixtral 8x7B layer (8 experts of 14336, top-2, alltoall dispatcher), 1
#          layer, 32,000 vocabulary, 4 microbatches.
# SHAPE=tiny (the default on a CPU; what CI runs, tests/slow/test_gpu_check.py): the same
# lines at hidden 128, seq 128, 2 layers, so the whole check takes under a minute.
#
# Outputs in $OUT (default: a temp dir): <case>.profile.json, <case>.projection.json,
# <case>.timings.json, <case>.project.log, <case>.train.log, compare.txt.
# Environment: PYTHON (default .venv/bin/python or python3), SHAPE, CASES, LAYERS, SEQ,
# ITERS (default 8 real, 12 tiny), NPROC (default 1; more runs torchrun).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PRIMUS_EXT_HOME=${PRIMUS_EXT_HOME:-$OUT/home}

read -r DEVICE HW < <("$PY" - <<'EOF'
import torch
from primus_ext.frameworks.megatron.runner import local_hardware
print("cuda" if torch.cuda.is_available() else "cpu", local_hardware())
EOF
)
if [ "$DEVICE" = cpu ]; then export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}; fi
SHAPE=${SHAPE:-$( [ "$DEVICE" = cuda ] && echo real || echo tiny )}
CASES=${CASES:-dense moe}
NPROC=${NPROC:-1}
if [ "$SHAPE" = real ]; then
  LAYERS=${LAYERS:-4}; SEQ=${SEQ:-4096}; ITERS=${ITERS:-8}
  H=4096; HEADS=32; KVG=8; FFN=14336; VOCAB=128256; MOE_VOCAB=32000
  MEASURE=(--measure-warmup 3 --measure-repeats 5)
else
  LAYERS=${LAYERS:-2}; SEQ=${SEQ:-128}; ITERS=${ITERS:-12}
  H=128; HEADS=4; KVG=2; FFN=256; VOCAB=1024; MOE_VOCAB=512
  # A CPU's first steps run several times slower (allocator, lazy init): warm up longer.
  MEASURE=(--measure-warmup 4 --measure-repeats 4)
fi
echo "gpu_check: device $DEVICE -> preset $HW; shape $SHAPE; cases: $CASES; out: $OUT"

COMMON=(--hidden-size "$H" --num-attention-heads "$HEADS" --group-query-attention
  --num-query-groups "$KVG" --kv-channels $((H / HEADS)) --swiglu --normalization RMSNorm
  --position-embedding-type rope --disable-bias-linear --untie-embeddings-and-output-weights
  --seq-length "$SEQ" --max-position-embeddings "$SEQ" --micro-batch-size 1 --bf16
  --use-distributed-optimizer --hidden-dropout 0 --attention-dropout 0 --mock-data
  --tokenizer-type NullTokenizer)
case_flags() {
  case "$1" in
    dense) echo --num-layers "$LAYERS" --ffn-hidden-size "$FFN" --vocab-size $((VOCAB - 1)) \
             --global-batch-size $((8 * NPROC)) ;;
    moe) echo --num-layers 1 --ffn-hidden-size "$FFN" --num-experts 8 --moe-router-topk 2 \
           --moe-ffn-hidden-size "$FFN" --moe-token-dispatcher-type alltoall \
           --vocab-size $((MOE_VOCAB - 1)) --global-batch-size $((4 * NPROC)) ;;
    *) echo "gpu_check: unknown case '$1' (dense, moe)" >&2; return 2 ;;
  esac
}
TARGET=(--target-hardware "$HW" --target-nodes 1 --target-gpus-per-node "$NPROC")
# One process needs no torchrun (the drop-in makes its own one-rank group).
RUN=("$PY" launch/pretrain_gpt.py)
[ "$NPROC" = 1 ] || RUN=("$PY" -m torch.distributed.run --standalone --nproc-per-node "$NPROC"
  launch/pretrain_gpt.py)

t_all=$(date +%s)
for c in $CASES; do
  read -r -a FL < <(case_flags "$c")
  echo "== $c: measure + project (hybrid) =="
  t0=$(date +%s)
  "${RUN[@]}" "${COMMON[@]}" "${FL[@]}" "${TARGET[@]}" --project-only "${MEASURE[@]}" \
    --profile-out "$OUT/$c.profile.json" --projection-out "$OUT/$c.projection.json" \
    > "$OUT/$c.project.log" 2> >(tee "$OUT/$c.project.err" | grep --line-buffered \
    -E "^primus-ext \[|error|Error" >&2)
  t1=$(date +%s)
  echo "== $c: real training, $ITERS iterations =="
  "${RUN[@]}" "${COMMON[@]}" "${FL[@]}" "${TARGET[@]}" --train-iters "$ITERS" \
    --timings-out "$OUT/$c.timings.json" > "$OUT/$c.train.log" 2> "$OUT/$c.train.err" \
    || { tail -20 "$OUT/$c.train.err" >&2; exit 1; }
  grep -E "iteration|median" "$OUT/$c.train.log" | tail -3
  t2=$(date +%s)
  echo "$c: measure+project $((t1 - t0)) s, real run $((t2 - t1)) s"
done
"$PY" scripts/gpu_check_table.py "$OUT" $CASES | tee "$OUT/compare.txt"
echo "gpu_check: done in $(( $(date +%s) - t_all )) s; outputs in $OUT"
