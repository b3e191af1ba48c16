#!/usr/bin/env bash
# Make sure the local PostgreSQL cluster answers on 127.0.0.1:5432; start it if it does not.
set -euo pipefail
host=${FW_PG_HOST:-127.0.0.1}
port=${FW_PG_PORT:-5432}
if pg_isready -q -h "$host" -p "$port"; then
  exit 0
fi
version=$(ls /etc/postgresql | sort -n | tail -n 1)
echo "starting PostgreSQL $version on $host:$port"
pg_ctlcluster --skip-systemctl-redirect "$version" main start
for _ in $(seq 1 60); do
  pg_isready -q -h "$host" -p "$port" && exit 0
  sleep 1
done
echo "PostgreSQL did not come up on $host:$port" >&2
exit 1
