#!/usr/bin/env bash
# Restart this machine's vLLM server on a new full checkpoint, served under the policy
# version's name, and return once the new process is started (the pipeline's serve step
# then waits for /health and /v1/models to list the name: flows/stages/serving.py).
#
#   infra/vllm/restart.sh CHECKPOINT_DIR SERVED_NAME [extra vllm serve args...]
#
# FW_SERVE_RESTART_COMMAND='infra/vllm/restart.sh {checkpoint} {served_name}' wires it in.
# Environment: PORT (8000) and the rest of serve.sh's; PIDFILE (infra/vllm/run/vllm-PORT.pid)
# and LOG (infra/vllm/run/vllm-PORT.log); VLLM_SERVE_SCRIPT (default serve.sh next to this
# file: anything that serves MODEL_DIR on $PORT under $SERVED_NAME); STOP_TIMEOUT_S (60).
set -euo pipefail

if [[ $# -lt 2 ]]; then
  echo "usage: $0 CHECKPOINT_DIR SERVED_NAME [extra vllm serve args...]" >&2
  exit 2
fi
CHECKPOINT="$1"; NAME="$2"; shift 2
if [[ ! -f "$CHECKPOINT/config.json" ]]; then
  echo "error: $CHECKPOINT is not a full model checkpoint (no config.json)" >&2
  exit 2
fi

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PORT="${PORT:-8000}"
RUN_DIR="$HERE/run"
PIDFILE="${PIDFILE:-$RUN_DIR/vllm-$PORT.pid}"
LOG="${LOG:-$RUN_DIR/vllm-$PORT.log}"
SERVE="${VLLM_SERVE_SCRIPT:-$HERE/serve.sh}"
mkdir -p "$(dirname "$PIDFILE")" "$(dirname "$LOG")"

# Stop the server this script started last (its pid file), politely first: the weights
# of the previous version leave the GPU before the next load.
if [[ -f "$PIDFILE" ]]; then
  OLD="$(cat "$PIDFILE")"
  if kill -0 "$OLD" 2>/dev/null; then
    kill -TERM "$OLD"
    for _ in $(seq 1 "$(( ${STOP_TIMEOUT_S:-60} * 10 ))"); do
      kill -0 "$OLD" 2>/dev/null || break
      sleep 0.1
    done
    if kill -0 "$OLD" 2>/dev/null; then
      kill -KILL "$OLD"
    fi
  fi
  rm -f "$PIDFILE"
fi

echo "$(date -u +%FT%TZ) serving $CHECKPOINT as $NAME on port $PORT" >> "$LOG"
PORT="$PORT" SERVED_NAME="$NAME" nohup "$SERVE" "$CHECKPOINT" "$@" >> "$LOG" 2>&1 < /dev/null &
echo $! > "$PIDFILE"
echo "started $NAME (pid $!) on port $PORT; log $LOG"
