#!/usr/bin/env bash
# The tests: installs what it needs, starts its own PostgreSQL (or uses HARVEST_DATABASE_URL),
# runs pytest. Extra arguments go to pytest. docs/design/testing.md describes the tiers.
#
#   bash scripts/test.sh            everything (what .ci/run runs): the suite's budget is 15 min on 2 cores
#   bash scripts/test.sh --fast     the edit loop, about 3 min on 2 cores: no end-to-end stack, no soak,
#                                   no DAG run through Airflow, nothing marked slow
set -euo pipefail
cd "$(dirname "$0")/.."
FAST=()
if [[ "${1:-}" == "--fast" ]]; then
    shift
    FAST=(-m "not (e2e or soak or airflow or slow)" tests/unit tests/integration tests/simulators
          tests/conformance tests/soak tests/dags)
fi
bash scripts/bootstrap.sh
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-/tmp/ph-runtime-$(id -u)}"
mkdir -p -m 700 "$XDG_RUNTIME_DIR"
# Two pytest-xdist workers, whole modules each (an e2e module's Airflow stack starts once),
# the longest modules first (tests/conftest.py); HARVEST_TEST_WORKERS=0 runs in one process.
exec .venv/bin/python -m pytest -n "${HARVEST_TEST_WORKERS:-2}" --dist loadscope --no-loadscope-reorder \
    ${FAST[@]+"${FAST[@]}"} "$@"
