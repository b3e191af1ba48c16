#!/usr/bin/env bash
# The GPU check (benchmarks/gpu_check.py): a bf16 trainer step of a ~0.5B Qwen2-shaped model
# (tokens/s, MFU against 6·N·T at the H200's 989 TFLOP/s), the local backend's generate
# against raw `generate`, and a 1-GPU FSDP2 step. Under 8 minutes on one H200.
#
#   benchmarks/gpu_check.sh [--smoke] [--out FILE.json]
#
# --smoke runs the same code paths on the CPU with a tiny config (tests/test_gpu_check.py).
# PYTHON defaults to the repository's .venv; a CUDA build of torch is needed without --smoke.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
if [[ ! -x "$PYTHON" ]]; then
  PYTHON="$(command -v python3)"
fi
cd "$ROOT"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export TOKENIZERS_PARALLELISM=false
if [[ " $* " != *" --smoke "* ]] && command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
fi
exec timeout "${GPU_CHECK_TIMEOUT_S:-480}" "$PYTHON" benchmarks/gpu_check.py "$@"
