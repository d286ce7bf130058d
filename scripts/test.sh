#!/usr/bin/env bash
# The whole test suite: installs what it needs, starts its own PostgreSQL (or uses
# HARVEST_DATABASE_URL), runs pytest. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-/tmp/ph-runtime-$(id -u)}"
mkdir -p -m 700 "$XDG_RUNTIME_DIR"
exec .venv/bin/python -m pytest "$@"
