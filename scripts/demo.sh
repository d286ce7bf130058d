#!/usr/bin/env bash
# Set everything up and run the main job: harvest the demo partners through Airflow into
# an embedded PostgreSQL, then print what landed. Extra arguments go to scripts/demo.py.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-/tmp}"
exec .venv/bin/python scripts/demo.py "$@"
