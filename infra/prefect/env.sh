# Shared settings of the Prefect scripts (sourced, not run). Override any of them beforehand.
export FW_PREFECT_PORT=${FW_PREFECT_PORT:-4200}
export FW_PREFECT_PG_HOST=${FW_PREFECT_PG_HOST:-127.0.0.1}
export FW_PREFECT_PG_PORT=${FW_PREFECT_PG_PORT:-5432}
export FW_PREFECT_PG_USER=${FW_PREFECT_PG_USER:-root}
export FW_PREFECT_PG_DB=${FW_PREFECT_PG_DB:-prefect}
export PREFECT_API_URL=${PREFECT_API_URL:-http://127.0.0.1:${FW_PREFECT_PORT}/api}
export PREFECT_SERVER_ANALYTICS_ENABLED=${PREFECT_SERVER_ANALYTICS_ENABLED:-false}
export DO_NOT_TRACK=${DO_NOT_TRACK:-1}
export FW_REPO_DIR=${FW_REPO_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
PREFECT=${PREFECT:-$FW_REPO_DIR/.venv/bin/prefect}
[ -x "$PREFECT" ] || PREFECT=prefect
