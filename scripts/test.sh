#!/usr/bin/env bash
# The tests: installs what it needs, starts its own PostgreSQL (or uses HARVEST_DATABASE_URL),
# runs pytest. docs/design/testing.md describes the tiers.
#
#   bash scripts/test.sh            everything (what .ci/run runs), in two steps: first the gate (lint, types
#                                   and the fast tier), stopping there on a failure; then everything else.
#                                   The suite's budget is 15 min on 2 cores
#   bash scripts/test.sh --fast     the edit loop, about 3 min on 2 cores: no end-to-end stack, no soak,
#                                   no DAG run through Airflow, nothing marked slow (types included)
#   bash scripts/test.sh ARGS...    one pytest run with these arguments (tests/integration -k token)
set -euo pipefail
cd "$(dirname "$0")/.."
FAST_TIER="not (e2e or soak or airflow or slow)"
bash scripts/bootstrap.sh
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-/tmp/ph-runtime-$(id -u)}"
mkdir -p -m 700 "$XDG_RUNTIME_DIR"
# Two pytest-xdist workers, whole modules each (an e2e module's Airflow stack starts once),
# the longest modules first (tests/conftest.py); HARVEST_TEST_WORKERS=0 runs in one process.
PYTEST=(.venv/bin/python -m pytest -n "${HARVEST_TEST_WORKERS:-2}" --dist loadscope --no-loadscope-reorder)
if [[ "${1:-}" == "--fast" ]]; then
    shift
    exec "${PYTEST[@]}" -m "$FAST_TIER" tests/unit tests/integration tests/simulators tests/conformance \
        tests/soak tests/dags "$@"
fi
if [[ $# -gt 0 ]]; then
    exec "${PYTEST[@]}" "$@"
fi
# The gate: lint and types (tests/unit/test_static_checks.py, marked static) beside the fast tier.
echo "==> the gate: lint, types and the fast tier"
"${PYTEST[@]}" -m "($FAST_TIER) or static" || { echo "==> the gate failed: the rest of the suite did not run"; exit 1; }
echo "==> the rest of the suite: end-to-end stacks, the soak, DAG runs through Airflow, slow tests"
exec "${PYTEST[@]}" -m "not (($FAST_TIER) or static)"
