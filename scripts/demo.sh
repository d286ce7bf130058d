#!/usr/bin/env bash
# Set everything up and run the main job: harvest the demo partners through Airflow into
# an embedded PostgreSQL, then print what landed. Extra arguments go to scripts/demo.py.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-/tmp/ph-runtime-$(id -u)}"
mkdir -p -m 700 "$XDG_RUNTIME_DIR"
exec .venv/bin/python scripts/demo.py "$@"
