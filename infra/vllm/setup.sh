#!/usr/bin/env bash
# Create a separate virtualenv for the vLLM server: vLLM pins its own torch and fastapi,
# so it never shares an environment with the pipeline. Needs a CUDA GPU host.
#
#   infra/vllm/setup.sh                 # venv in infra/vllm/.venv, latest vllm
#   VLLM_VENV=/opt/vllm VLLM_VERSION=0.11.0 infra/vllm/setup.sh
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENV="${VLLM_VENV:-$HERE/.venv}"
PYTHON="${PYTHON:-python3}"
# 0.10.2 is the first release with --logprobs-mode (serve.sh needs processed_logprobs).
SPEC="vllm>=0.10.2"
if [[ -n "${VLLM_VERSION:-}" ]]; then
  SPEC="vllm==${VLLM_VERSION}"
fi

if ! command -v nvidia-smi >/dev/null 2>&1; then
  echo "warning: no nvidia-smi found; vLLM's server needs a CUDA GPU (it cannot serve on this CPU-only machine)" >&2
fi

"$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install --upgrade pip
"$VENV/bin/python" -m pip install "$SPEC"
"$VENV/bin/python" -c "import vllm; print('vllm', vllm.__version__, 'installed in $VENV')"
