#!/usr/bin/env bash
# The whole test suite: installs what it needs, starts its own PostgreSQL (or uses
# HARVEST_DATABASE_URL), runs pytest. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-/tmp/ph-runtime-$(id -u)}"
mkdir -p -m 700 "$XDG_RUNTIME_DIR"
# Two pytest-xdist workers, whole modules each (an e2e module's Airflow stack starts once),
# the longest modules first (tests/conftest.py); HARVEST_TEST_WORKERS=0 runs in one process.
exec .venv/bin/python -m pytest -n "${HARVEST_TEST_WORKERS:-2}" --dist loadscope --no-loadscope-reorder "$@"
