#!/usr/bin/env bash
# Idempotent setup: a .venv with torch 2.13.0 (CPU build), megatron-core and primus-ext
# (editable, compat mode so Hydra discovers the hydra_plugins namespace), with extras
# (measure, dev, and launchers: Hydra's submitit launcher for sweeps on SLURM).
# Never installs transformer-engine: on a CPU machine it breaks `import megatron.core`.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.primus-ext-setup
want="$(sha1sum pyproject.toml scripts/setup.sh | sha1sum | cut -c1-16)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
# torch first and pinned: a plain `torch` requirement would pull a multi-GB CUDA build.
.venv/bin/python -m pip install -q "torch==2.13.0"
.venv/bin/python -m pip install -q "megatron-core>=0.14,<0.20"
# torchtitan (extra `torchtitan`: torchtitan 0.3.0 and triton, about 410 MB of wheels)
# so that the tests parse recipes with torchtitan's own ConfigManager; the Hydra
# submitit launcher (extra `launchers`) for sweeps and tuner shards.
.venv/bin/python -m pip install -q -e ".[measure,dev,torchtitan,launchers]" --config-settings editable_mode=compat
if .venv/bin/python -m pip show transformer-engine >/dev/null 2>&1; then
  echo "setup: transformer-engine is installed in .venv; remove it on CPU machines" >&2
  exit 1
fi
echo "$want" > "$stamp"
