"""The partner_harvest plugin registers once in the local layout (plugins/ as Airflow's
plugins folder and on sys.path, the package installed editable), as scripts/airflow_ui.sh
runs it: no "Plugin 'partner_harvest' already registered" import error on the UI's Home page.

The editable install leaves plugins/partner_harvest.egg-info behind; with plugins/ on
sys.path Python then sees the distribution twice and Airflow loads its entry point twice
(issue 25). scripts/bootstrap.sh and scripts/airflow_ui.py remove it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROBE = """
import json
from airflow import plugins_manager
plugins, errors = plugins_manager._get_plugins()
print(json.dumps({"plugins": [p.name for p in plugins], "errors": errors}))
"""


@pytest.mark.slow  # starts Airflow processes
def test_the_plugin_registers_once_without_an_import_error(tmp_path: Path) -> None:
    stray = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "plugins").glob("*.egg-info"))
    assert stray == [], f"{stray} on Airflow's sys.path: run scripts/bootstrap.sh (it removes them)"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "HARVEST_"))}
    env.update({
        "AIRFLOW_HOME": str(tmp_path), "AIRFLOW__CORE__PLUGINS_FOLDER": str(ROOT / "plugins"),
        "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"), "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "PYTHONPATH": os.pathsep.join([str(ROOT / "config"), str(ROOT / "plugins"), str(ROOT)]),
    })
    done = subprocess.run([sys.executable, "-c", PROBE], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    loaded = json.loads(done.stdout.strip().splitlines()[-1])
    assert loaded == {"plugins": ["partner_harvest"], "errors": {}}
