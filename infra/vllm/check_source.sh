#!/usr/bin/env bash
# Check an unpacked vLLM source tree (an sdist from PyPI) for what the pipeline relies on:
# serve.sh's flags and environment, the endpoints flows.stages.serving calls, and the
# request and response fields of futureworld.policy.openai_http. One line per feature;
# exits 1 if any is missing. It reads source text, so it proves presence, not behaviour.
#
#   infra/vllm/check_source.sh /tmp/vllm-0.33.0
set -uo pipefail

if [[ $# -ne 1 || ! -d "$1/vllm" ]]; then
  echo "usage: $0 VLLM_SOURCE_DIR (an unpacked sdist, holding vllm/)" >&2
  exit 2
fi
cd "$1"
missing=0
check() {  # check NAME REGEX PATH...
  local name="$1" pattern="$2"
  shift 2
  if grep -rqE -- "$pattern" "$@" 2>/dev/null; then
    echo "ok       $name"
  else
    echo "MISSING  $name"
    missing=1
  fi
}

check "--logprobs-mode processed_logprobs" 'processed_logprobs' vllm/config
check "processed log-probs are taken after temperature and top_k/top_p" \
  'Processed means the values after applying all processors' vllm/config
check "--generation-config (vllm: ignore the checkpoint's defaults)" 'generation_config: str' vllm/config
check "--enable-lora" 'enable_lora: ' vllm/engine/arg_utils.py
check "--max-lora-rank, --max-loras" 'max_loras: ' vllm/config
check "--enable-prefix-caching" 'enable_prefix_caching: ' vllm/config vllm/engine/arg_utils.py
check "--served-model-name" 'served_model_name: ' vllm/config
check "VLLM_ALLOW_RUNTIME_LORA_UPDATING" '"VLLM_ALLOW_RUNTIME_LORA_UPDATING"' vllm/envs.py
check "POST /v1/load_lora_adapter" '/v1/load_lora_adapter"' vllm
check "POST /v1/unload_lora_adapter" '/v1/unload_lora_adapter"' vllm
check "GET /health" '"/health"' vllm/entrypoints
check "GET /v1/models" '"/v1/models"' vllm/entrypoints
check "completions: return_token_ids" 'return_token_ids: (Optional\[bool\]|bool \| None)' vllm/entrypoints
check "completions: return_tokens_as_token_ids" 'return_tokens_as_token_ids: ' vllm/entrypoints
check "completions: include_stop_str_in_output" 'include_stop_str_in_output: ' vllm/entrypoints
check "completions: skip_special_tokens" 'skip_special_tokens: ' vllm/entrypoints
check "completions: repetition_penalty, min_p" 'repetition_penalty: ' vllm/entrypoints
check "completions: a choice's token_ids" \
  'token_ids: (Optional\[list\[int\]\]|list\[int\] \| None) = None +# For response' vllm/entrypoints
check "top_k = -1 accepted (disabled)" 'top_k < -1' vllm/sampling_params.py
exit "$missing"
