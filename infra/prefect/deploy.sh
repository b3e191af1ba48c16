#!/usr/bin/env bash
# Register the deployments of prefect.yaml (daily-cycle, replay-and-train, evaluate) with the
# server; the worker runs them in this checkout (FW_REPO_DIR). Re-running updates them.
set -euo pipefail
source "$(dirname "$0")/env.sh"
cd "$FW_REPO_DIR"
"$PREFECT" work-pool inspect futureworld >/dev/null 2>&1 \
  || "$PREFECT" work-pool create futureworld --type process
exec "$PREFECT" --no-prompt deploy --all
