#!/usr/bin/env bash
# Start the Prefect API and UI on 127.0.0.1, backed by PostgreSQL (database `prefect`,
# created when missing). Runs in the foreground; stop it with Ctrl-C.
set -euo pipefail
source "$(dirname "$0")/env.sh"
bash "$FW_REPO_DIR/infra/postgres/ensure.sh"
pg=(-h "$FW_PREFECT_PG_HOST" -p "$FW_PREFECT_PG_PORT" -U "$FW_PREFECT_PG_USER")
if ! psql "${pg[@]}" -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname = '$FW_PREFECT_PG_DB'" \
    | grep -q 1; then
  createdb "${pg[@]}" "$FW_PREFECT_PG_DB"
fi
export PREFECT_API_DATABASE_CONNECTION_URL=${PREFECT_API_DATABASE_CONNECTION_URL:-postgresql+asyncpg://${FW_PREFECT_PG_USER}@${FW_PREFECT_PG_HOST}:${FW_PREFECT_PG_PORT}/${FW_PREFECT_PG_DB}}
exec "$PREFECT" server start --host 127.0.0.1 --port "$FW_PREFECT_PORT"
