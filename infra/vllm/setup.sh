#!/usr/bin/env bash
# Create a separate virtualenv for the vLLM server: vLLM pins its own torch and fastapi,
# so it never shares an environment with the pipeline. Needs a CUDA GPU host.
#
#   infra/vllm/setup.sh                 # venv in infra/vllm/.venv, newest vllm in the tested range
#   VLLM_VENV=/opt/vllm VLLM_VERSION=0.11.0 infra/vllm/setup.sh
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENV="${VLLM_VENV:-$HERE/.venv}"
PYTHON="${PYTHON:-python3}"
# The tested range (infra/vllm/README.md, "Which vLLM"): 0.10.2 is the first release whose
# processed_logprobs are taken after temperature and whose completions API has
# return_token_ids; 0.33.0 is the newest release whose source was checked for every flag,
# endpoint and request field the pipeline uses (infra/vllm/check_source.sh).
VLLM_FLOOR=0.10.2
VLLM_CEILING=0.33.0
SPEC="vllm>=${VLLM_FLOOR},<=${VLLM_CEILING}"
if [[ -n "${VLLM_VERSION:-}" ]]; then
  SPEC="vllm==${VLLM_VERSION}"
  lowest="$(printf '%s\n%s\n' "$VLLM_FLOOR" "$VLLM_VERSION" | sort -V | head -1)"
  highest="$(printf '%s\n%s\n' "$VLLM_CEILING" "$VLLM_VERSION" | sort -V | tail -1)"
  if [[ "$lowest" != "$VLLM_FLOOR" || "$highest" != "$VLLM_CEILING" ]]; then
    echo "warning: vllm $VLLM_VERSION is outside the tested range $VLLM_FLOOR–$VLLM_CEILING; check it with infra/vllm/check_source.sh first" >&2
  fi
fi

if ! command -v nvidia-smi >/dev/null 2>&1; then
  echo "warning: no nvidia-smi found; vLLM's server needs a CUDA GPU (it cannot serve on this CPU-only machine)" >&2
fi

"$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install --upgrade pip
"$VENV/bin/python" -m pip install "$SPEC"
"$VENV/bin/python" -c "import vllm; print('vllm', vllm.__version__, 'installed in $VENV')"
