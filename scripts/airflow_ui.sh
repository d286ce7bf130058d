#!/usr/bin/env bash
# Run the partner DAGs in a local Airflow with its UI on http://127.0.0.1:8080 (loopback only):
# embedded PostgreSQL, the two demo partner simulators, api-server, scheduler, dag-processor.
# Ctrl-C (or kill <pid>) stops everything it started. Arguments go to scripts/airflow_ui.py
# (--port, --home, --records, --db-prefix). HARVEST_SKIP_BOOTSTRAP=1 skips the install check.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${HARVEST_SKIP_BOOTSTRAP:-}" != "1" ]; then
  bash scripts/bootstrap.sh
fi
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-/tmp/ph-runtime-$(id -u)}"
mkdir -p -m 700 "$XDG_RUNTIME_DIR"
exec .venv/bin/python scripts/airflow_ui.py "$@"
