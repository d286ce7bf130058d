"""The partner_harvest plugin registers once in the local layout (the package installed
editable, plugins/ on sys.path, Airflow's plugins folder its default and empty), as
scripts/airflow_ui.sh runs it: no "Plugin 'partner_harvest' already registered" import error on
the UI's Home page. A plugins folder holding the sources is refused with one clear error.
Loaded, it has imported every protocol's adapter module (airflow/preload.py).

The editable install leaves plugins/partner_harvest.egg-info behind; with plugins/ on
sys.path Python then sees the distribution twice and Airflow loads its entry point twice.
scripts/bootstrap.sh and scripts/airflow_ui.py remove it.
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
import json, sys
from airflow import plugins_manager
from partner_harvest.protocols import specs
plugins, errors = plugins_manager._get_plugins()
print(json.dumps({"plugins": [p.name for p in plugins], "errors": errors,
                  "stacks": {spec.stack: spec.stack in sys.modules for spec in specs()}}))
"""


def load_plugins(home: Path, plugins_folder: Path | None) -> dict[str, object]:
    """The plugins and import errors a fresh Airflow process reports (Airflow's own loader)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "HARVEST_"))}
    env.update({
        "AIRFLOW_HOME": str(home), "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "PYTHONPATH": os.pathsep.join([str(ROOT / "config"), str(ROOT / "plugins"), str(ROOT)]),
    })
    if plugins_folder is not None:
        env["AIRFLOW__CORE__PLUGINS_FOLDER"] = str(plugins_folder)
    done = subprocess.run([sys.executable, "-c", PROBE], env=env, cwd=home, capture_output=True, text=True,
                          timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    loaded: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return loaded


@pytest.mark.slow  # starts Airflow processes
def test_the_plugin_registers_once_without_an_import_error(tmp_path: Path) -> None:
    stray = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "plugins").glob("*.egg-info"))
    assert stray == [], f"{stray} on Airflow's sys.path: run scripts/bootstrap.sh (it removes them)"
    loaded = load_plugins(tmp_path, None)
    assert loaded["errors"] == {}
    plugins = loaded["plugins"]
    assert isinstance(plugins, list) and plugins.count("partner_harvest") == 1  # providers may bring their own
    # what every task that talks to a partner imports, inherited by the processes Airflow forks
    stacks = loaded["stacks"]
    assert isinstance(stacks, dict) and stacks and all(stacks.values()), stacks


@pytest.mark.slow  # starts Airflow processes
def test_a_plugins_folder_holding_the_sources_is_refused_by_name(tmp_path: Path) -> None:
    loaded = load_plugins(tmp_path, ROOT / "plugins")
    assert "partner_harvest" not in loaded["plugins"]  # type: ignore[operator]
    errors = loaded["errors"]
    assert isinstance(errors, dict)
    assert any("holds the library's sources" in message for message in errors.values()), errors
