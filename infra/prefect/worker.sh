#!/usr/bin/env bash
# Create the `futureworld` process work pool and the task concurrency limits (once), then run
# a worker in the foreground. Needs the server from server.sh.
set -euo pipefail
source "$(dirname "$0")/env.sh"
"$PREFECT" work-pool inspect futureworld >/dev/null 2>&1 \
  || "$PREFECT" work-pool create futureworld --type process
# One trainer per accelerator; predict workers share the generation backend.
"$PREFECT" concurrency-limit create futureworld-train "${FW_TRAIN_CONCURRENCY:-1}" >/dev/null
"$PREFECT" concurrency-limit create futureworld-predict "${FW_PREDICT_CONCURRENCY:-2}" >/dev/null
cd "$FW_REPO_DIR"
exec "$PREFECT" worker start --pool futureworld --type process
