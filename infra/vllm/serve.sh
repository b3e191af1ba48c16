#!/usr/bin/env bash
# Serve a local model directory with vLLM's OpenAI-compatible API, LoRA enabled, so the
# pipeline's HTTP backend can sample from the base model or any loaded policy adapter.
#
#   infra/vllm/serve.sh /models/Qwen2.5-1.5B-Instruct [extra vllm args...]
#
# Environment: VLLM_VENV (default infra/vllm/.venv), HOST (127.0.0.1), PORT (8000),
# SERVED_NAME (default: the directory name), MAX_LORA_RANK (64), MAX_LORAS (4),
# MAX_MODEL_LEN (8192), GPU_MEMORY_UTILIZATION (0.85).
set -euo pipefail

if [[ $# -lt 1 ]]; then
  echo "usage: $0 MODEL_DIR [extra vllm serve args...]" >&2
  exit 2
fi
MODEL_DIR="$1"; shift
if [[ ! -f "$MODEL_DIR/config.json" ]]; then
  echo "error: $MODEL_DIR is not a model directory (no config.json)" >&2
  exit 2
fi

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENV="${VLLM_VENV:-$HERE/.venv}"
if [[ ! -x "$VENV/bin/vllm" ]]; then
  echo "error: no vllm in $VENV; run infra/vllm/setup.sh first" >&2
  exit 2
fi

# Lets the pipeline register each new policy version's adapter with
# POST /v1/load_lora_adapter (OpenAIHttpBackend.load_adapter). Keep the server on
# loopback or a private network: anyone who can reach it can load adapters.
export VLLM_ALLOW_RUNTIME_LORA_UPDATING=True
export HF_HUB_OFFLINE=1

# --logprobs-mode processed_logprobs: returned log-probs are taken after temperature,
#   i.e. log softmax(logits / T), the behaviour policy μ that training corrects for.
# --generation-config vllm: ignore the checkpoint's generation_config.json defaults
#   (top_k, top_p, repetition penalty) so requests sample exactly what they ask for.
exec "$VENV/bin/vllm" serve "$MODEL_DIR" \
  --served-model-name "${SERVED_NAME:-$(basename "$MODEL_DIR")}" \
  --host "${HOST:-127.0.0.1}" \
  --port "${PORT:-8000}" \
  --enable-lora \
  --max-lora-rank "${MAX_LORA_RANK:-64}" \
  --max-loras "${MAX_LORAS:-4}" \
  --max-model-len "${MAX_MODEL_LEN:-8192}" \
  --gpu-memory-utilization "${GPU_MEMORY_UTILIZATION:-0.85}" \
  --logprobs-mode processed_logprobs \
  --generation-config vllm \
  --enable-prefix-caching \
  "$@"
