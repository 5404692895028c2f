#!/usr/bin/env bash
# One GPU, one prepared check of the hybrid mode (about 4-6 minutes on an H100/H200):
#
#   1. measure a downscaled Llama-style model on the GPU and project the full-depth model
#      (launch/pretrain_gpt.py --project-only: TE spec if Transformer Engine imports, CUDA
#      events, no CPU patches);
#   2. run the full-depth model for real for a few iterations;
#   3. print projected vs measured step time, and the measured per-layer times against
#      the simulate backend's estimate for this GPU.
#
# Outputs go to $OUT (default: a temp dir): profile.json, projection.json, timings.json,
# project.log, train.log, compare.txt. Environment: PYTHON (default .venv/bin/python or
# python3), LAYERS (default 8), SEQ (default 4096), ITERS (default 10).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
LAYERS=${LAYERS:-8}
SEQ=${SEQ:-4096}
ITERS=${ITERS:-10}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

HW=$($PY - <<'EOF'
import torch
assert torch.cuda.is_available(), "gpu_check.sh needs a CUDA device"
from primus_ext.frameworks.megatron.runner import local_hardware
print(local_hardware())
EOF
)
echo "device: $($PY -c 'import torch; print(torch.cuda.get_device_name())') -> preset $HW; out: $OUT"

# Llama-3-8B-like layer (hidden 4096, 32 heads, 8 KV groups, SwiGLU 14336, RoPE, RMSNorm),
# $LAYERS layers, 32k vocabulary: fits one 80 GB GPU with Adam and the distributed optimizer.
MODEL=(--num-layers "$LAYERS" --hidden-size 4096 --num-attention-heads 32
  --group-query-attention --num-query-groups 8 --ffn-hidden-size 14336 --swiglu
  --normalization RMSNorm --position-embedding-type rope --disable-bias-linear
  --untie-embeddings-and-output-weights --seq-length "$SEQ" --max-position-embeddings "$SEQ"
  --micro-batch-size 1 --global-batch-size 8 --bf16 --use-distributed-optimizer
  --hidden-dropout 0 --attention-dropout 0 --mock-data --tokenizer-type NullTokenizer
  --vocab-size 31999)
TARGET=(--target-hardware "$HW" --target-nodes 1 --target-gpus-per-node 1)
RUN=($PY -m torch.distributed.run --standalone --nproc-per-node 1 launch/pretrain_gpt.py)

t0=$(date +%s)
"${RUN[@]}" "${MODEL[@]}" "${TARGET[@]}" --project-only --measure-warmup 3 \
  --measure-repeats 5 --profile-out "$OUT/profile.json" \
  --projection-out "$OUT/projection.json" 2>&1 | tee "$OUT/project.log" | grep -v Warning
t1=$(date +%s)
"${RUN[@]}" "${MODEL[@]}" --train-iters "$ITERS" --timings-out "$OUT/timings.json" 2>&1 \
  | tee "$OUT/train.log" | grep -E "iteration|median|error|Error"
t2=$(date +%s)

$PY - "$OUT" "$HW" "${MODEL[@]}" "${TARGET[@]}" <<'EOF' | tee "$OUT/compare.txt"
import json, sys
out, hw, argv = sys.argv[1], sys.argv[2], sys.argv[3:]
from primus_ext.project.simulate_backend import simulate_layer_costs
from primus_ext.frameworks.megatron.args import parse_megatron_args
from primus_ext.project.profile import Profile
from primus_ext.project.from_profile import measured_spec
proj = json.load(open(f"{out}/projection.json"))
real = json.load(open(f"{out}/timings.json"))
p, m = proj["step_time_s"], real["median_step_s"]
print(f"\nfull depth on 1 x {hw}: projected step {p:.4f} s, measured {m:.4f} s, "
      f"error {(p - m) / m:+.1%}")
prof = Profile.load(f"{out}/profile.json")
target = parse_megatron_args(argv)
sim = simulate_layer_costs(measured_spec(prof, target)).kinds
print(f"per layer kind, one microbatch: measured on {prof.device['name']} vs the simulate "
      f"backend's {hw} model (ms)")
print(f"{'kind':<10} {'fwd meas':>9} {'fwd sim':>9} {'bwd meas':>9} {'bwd sim':>9}")
for kind, kt in prof.layers.items():
    s = sim.get(kind)
    if s is None:
        continue
    sb = s.bwd_input_s + s.bwd_weight_s + s.bwd_comm_s
    print(f"{kind:<10} {kt.fwd_s * 1e3:>9.3f} {s.fwd_total_s * 1e3:>9.3f} "
          f"{kt.bwd_s * 1e3:>9.3f} {sb * 1e3:>9.3f}")
EOF
echo "wall: measure+project $((t1 - t0)) s, real run $((t2 - t1)) s; outputs in $OUT"
