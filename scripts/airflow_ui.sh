#!/usr/bin/env bash
# Run the partner DAGs in a local Airflow with its UI on http://127.0.0.1:8080 (loopback only):
# embedded PostgreSQL, the three demo partner simulators, an alert inbox, api-server, scheduler,
# dag-processor, triggerer. Ctrl-C (or kill <pid>) stops everything it started but the embedded
# PostgreSQL. Arguments go to scripts/airflow_ui.py (--port, --home, --records, --db-prefix;
# `env`: the exports for partner-harvest, eval "$(bash scripts/airflow_ui.sh env)"; `stop-db`).
# HARVEST_SKIP_BOOTSTRAP=1 skips the install check.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${HARVEST_SKIP_BOOTSTRAP:-}" != "1" ]; then
  bash scripts/bootstrap.sh >&2  # stdout stays the exports of `env`
fi
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-/tmp/ph-runtime-$(id -u)}"
mkdir -p -m 700 "$XDG_RUNTIME_DIR"
exec .venv/bin/python scripts/airflow_ui.py "$@"
