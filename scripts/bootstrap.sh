#!/usr/bin/env bash
# Create .venv, install the pinned dependencies and this project in editable mode (skipped
# when nothing changed). Editable: the package's airflow.plugins entry point and the
# partner-harvest command work here as in a deployment, from the sources in plugins/.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
if [ ! -x .venv/bin/python ]; then
  echo "==> creating .venv with $("$PYTHON" --version)"
  "$PYTHON" -m venv .venv
fi
stamp=.venv/.installed-$(cat requirements.txt requirements-dev.txt constraints.txt pyproject.toml | sha1sum | cut -c1-12)
if [ ! -f "$stamp" ]; then
  # uv (pinned, from PyPI through pip) installs the same pins in parallel: about 20 s against pip's
  # two to three minutes on a fresh machine. pip does it when uv cannot be had or fails.
  PIP=(.venv/bin/python -m pip install --quiet --disable-pip-version-check)
  INSTALL=("${PIP[@]}") TOOL=pip
  if "${PIP[@]}" uv -c constraints.txt >/dev/null 2>&1; then
    INSTALL=(.venv/bin/uv pip install --quiet --python .venv/bin/python) TOOL=uv
  fi
  echo "==> installing pinned dependencies (requirements-dev.txt + constraints.txt) with $TOOL"
  "${INSTALL[@]}" -r requirements-dev.txt -c constraints.txt || "${PIP[@]}" -r requirements-dev.txt -c constraints.txt
  echo "==> installing this project in editable mode (--no-deps -e .)"
  "${INSTALL[@]}" --no-deps -e . || "${PIP[@]}" --no-deps -e .
  rm -f .venv/.installed-*
  touch "$stamp"
fi
# The editable install writes plugins/partner_harvest.egg-info. With plugins/ on sys.path (the
# editable install's .pth puts it there) Python sees the package twice and Airflow loads its plugin entry
# point twice ("Plugin 'partner_harvest' already registered" on the UI's Home page): drop it.
rm -rf plugins/*.egg-info
# The health page's browser test drives Debian's Chromium (no browser can be downloaded by
# playwright here). Installed when missing and this user may install packages.
if [ ! -x /usr/bin/chromium ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "==> installing chromium (apt-get) for tests/e2e/test_health_page.py"
  apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null
fi
# The Celery e2e test (tests/e2e/test_celery_executor.py) starts its own Redis broker on loopback
# from Debian's redis-server (the binary only; the system service is not used).
if ! command -v redis-server >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "==> installing redis-server (apt-get) for tests/e2e/test_celery_executor.py"
  apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q redis-server >/dev/null
fi
