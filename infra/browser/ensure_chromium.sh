#!/usr/bin/env bash
# Make sure a headless-capable Chromium is installed (the artifact browser test renders the
# Prefect UI in it). Idempotent: does nothing when `chromium` is already on PATH.
set -euo pipefail
if command -v chromium >/dev/null 2>&1; then
  exit 0
fi
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then
    sudo="sudo"
  else
    echo "chromium is missing and this user cannot install it (not root, no sudo)" >&2
    exit 1
  fi
fi
echo "installing chromium (Debian package)"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends chromium fonts-liberation >/dev/null
command -v chromium >/dev/null 2>&1 || { echo "chromium did not install" >&2; exit 1; }
chromium --version
