#!/usr/bin/env bash
# Install check (docs/operator/install.md): in a temporary directory,
#   1. a clean virtualenv with apache-airflow installed on its own (as the official image
#      has it; AIRFLOW_CONSTRAINTS=<file or URL> adds Airflow's own constraints file),
#   2. `pip install <this repository>` WITHOUT our constraints.txt,
#   3. pip freeze before/after: only partner-harvest and its few new dependencies may
#      appear, none of Airflow's packages may change (exit 1 otherwise),
#   4. the DAGs parse (dags folder = this repo's dags/, plugins folder = an EMPTY directory,
#      HARVEST_PARTNERS_FILE = include/partners.yaml), the plugin is registered through its
#      entry point, partner_harvest comes from site-packages,
#   5. `partner-harvest validate` passes.
# About 1.5 minutes with a warm pip cache (docs/operator/install.md).
# KEEP=1 keeps the directory. PYTHON picks the interpreter (default python3.11),
# AIRFLOW_VERSION another Airflow (default: the pin in requirements.txt).
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
PYTHON="${PYTHON:-python3.11}"
AIRFLOW_VERSION="${AIRFLOW_VERSION:-$(sed -n 's/^apache-airflow==\([^ ;#]*\).*/\1/p' "$REPO/requirements.txt")}"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/ph-install-check.XXXXXX")"
[ "${KEEP:-0}" = 1 ] && echo "keeping $WORK" || trap 'rm -rf "$WORK"' EXIT
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f s", b - a }'; }
PIP=("$WORK/venv/bin/python" -m pip --disable-pip-version-check --quiet)
# pip, minus the noise of local find-links/index directories that lack a package
pip_() { "${PIP[@]}" "$@" 2> >(grep -v "^WARNING: Location 'file:" >&2); }

echo "==> 1. clean venv ($("$PYTHON" --version)) + apache-airflow==$AIRFLOW_VERSION alone"
t0=$(now)
"$PYTHON" -m venv "$WORK/venv"
pip_ install --upgrade pip >/dev/null
if [ -n "${AIRFLOW_CONSTRAINTS:-}" ]; then
  pip_ install "apache-airflow==$AIRFLOW_VERSION" -c "$AIRFLOW_CONSTRAINTS"
else
  pip_ install "apache-airflow==$AIRFLOW_VERSION"
fi
t1=$(now)
echo "    took $(elapsed "$t0" "$t1")"
"${PIP[@]}" freeze --all | grep -v '^\(pip\|setuptools\|wheel\)==' | sort > "$WORK/freeze-before.txt"
echo "    $(wc -l < "$WORK/freeze-before.txt") packages"

echo "==> 2. pip install <repo> (no constraints file)"
# Build from a copy of what a clone holds (tracked and untracked-not-ignored files), so the
# build leaves nothing behind in the repository.
mkdir "$WORK/src"
(cd "$REPO" && git ls-files -z --cached --others --exclude-standard | xargs -0 tar -cf - --ignore-failed-read 2>/dev/null) \
  | tar -xf - -C "$WORK/src"
t2=$(now)
pip_ install "$WORK/src"
t3=$(now)
echo "    took $(elapsed "$t2" "$t3")"
"${PIP[@]}" freeze --all | grep -v '^\(pip\|setuptools\|wheel\)==' | sed 's/^partner-harvest @ .*/partner-harvest @ (this repository)/' | sort > "$WORK/freeze-after.txt"

echo "==> 3. pip freeze, before -> after"
added="$(comm -13 "$WORK/freeze-before.txt" "$WORK/freeze-after.txt")"
gone="$(comm -23 "$WORK/freeze-before.txt" "$WORK/freeze-after.txt")"
echo "    added:";   echo "${added:-    (none)}" | sed 's/^/      + /'
if [ -n "$gone" ]; then
  echo "    CHANGED OR REMOVED (pip touched Airflow's environment):"
  echo "$gone" | sed 's/^/      - /'
  exit 1
fi
echo "    none of the $(wc -l < "$WORK/freeze-before.txt") packages Airflow brought changed"
"$WORK/venv/bin/python" -m pip check | sed 's/^/    pip check: /'

echo "==> 4. DAGs parse with an empty plugins folder"
mkdir -p "$WORK/airflow" "$WORK/empty-plugins"
export AIRFLOW_HOME="$WORK/airflow" AIRFLOW__CORE__LOAD_EXAMPLES=False
export AIRFLOW__CORE__DAGS_FOLDER="$REPO/dags" AIRFLOW__CORE__PLUGINS_FOLDER="$WORK/empty-plugins"
export HARVEST_PARTNERS_FILE="$REPO/include/partners.yaml"
unset PYTHONPATH
t4=$(now)
(cd "$WORK" && "$WORK/venv/bin/python" - <<'EOF'
import os
import sys

import partner_harvest
from airflow import plugins_manager
from airflow.dag_processing.dagbag import DagBag

where = os.path.dirname(partner_harvest.__file__)
print(f"    partner_harvest from {where}")
assert "site-packages" in where, "partner_harvest must come from the installed package"
bag = DagBag(dag_folder=os.environ["AIRFLOW__CORE__DAGS_FOLDER"])
for path, error in bag.import_errors.items():
    print(f"    IMPORT ERROR {path}: {error}")
print(f"    {len(bag.dags)} DAGs: {', '.join(sorted(bag.dags))}")
plugins, errors = plugins_manager._get_plugins()
names = [p.name for p in plugins]
print(f"    plugins: {', '.join(names) or 'none'}; plugin import errors: {errors or 'none'}")
sys.exit(0 if bag.dags and not bag.import_errors and "partner_harvest" in names and not errors else 1)
EOF
)
t5=$(now)
echo "    took $(elapsed "$t4" "$t5")"

echo "==> 5. partner-harvest validate"
"$WORK/venv/bin/partner-harvest" validate | sed 's/^/    /'
echo "==> OK: Airflow $AIRFLOW_VERSION alone $(elapsed "$t0" "$t1"), package $(elapsed "$t2" "$t3"), parse $(elapsed "$t4" "$t5")"
