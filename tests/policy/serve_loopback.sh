#!/usr/bin/env bash
# Stands in for infra/vllm/serve.sh where no GPU is: serves MODEL_DIR with the loopback
# completions server on $PORT under $SERVED_NAME (VLLM_SERVE_SCRIPT of infra/vllm/restart.sh).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
exec "${PYTHON:-$ROOT/.venv/bin/python}" -m tests.policy.completions_server "$1" \
  --port "$PORT" --served-name "$SERVED_NAME"
