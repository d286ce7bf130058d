"""A task or parse process forked by an Airflow process inherits the library and the
registry instead of importing and parsing them again (about a third of a quiet night's CPU), and
what a DAG's first build loads lazily (the providers' asset URI handlers).

Airflow loads plugins when a job starts, before the scheduler forks its LocalExecutor workers
and before the dag-processor forks its first parse; the plugin imports the library then, and
before each fork the parent reads the registry into its cache. Run in a fresh interpreter:
a fork hook registered in the test process would outlive the test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.support.airflow_stack import ROOT

SCRIPT = textwrap.dedent('''
    import json, os, sys
    from pathlib import Path

    def entries(*ids):
        return "partners:\\n" + "".join(
            f"  - id: {pid}\\n    protocol: oai-pmh\\n    conn_id: partner_{pid}\\n" for pid in ids)

    registry_file = Path(os.environ["HARVEST_PARTNERS_FILE"])
    registry_file.write_text(entries("alpha", "beta"))
    from airflow.listeners.listener import get_listener_manager

    get_listener_manager()  # what every Airflow job does at its start: load the plugins
    from partner_harvest import registry

    def forked_child_reads():
        """In a forked child: the partners it sees and how many YAML parses that took it."""
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            parsed = registry.LOADS["yaml"]
            ids = [p.id for p in registry.load_registry().partners]
            os.write(write, json.dumps({"ids": ids, "parsed": registry.LOADS["yaml"] - parsed}).encode())
            os._exit(0)
        os.close(write)
        os.waitpid(pid, 0)
        with os.fdopen(read) as answer:
            return json.loads(answer.read())

    def forked_build_imports():
        """In a forked child: the modules building a partner's DAG loaded that its parent had not."""
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            from partner_harvest.airflow.dag_factory import build_dags

            before = set(sys.modules)
            build_dags("harvest", "harvest_alpha")
            os.write(write, json.dumps(sorted(set(sys.modules) - before)).encode())
            os._exit(0)
        os.close(write)
        os.waitpid(pid, 0)
        with os.fdopen(read) as answer:
            return json.loads(answer.read())

    result = {"library_loaded": "partner_harvest.airflow.dag_factory" in sys.modules}
    result["build_imports"] = forked_build_imports()
    result["first"] = forked_child_reads()
    registry_file.write_text(entries("alpha", "beta", "gamma"))  # an edit between two tasks
    result["edited"] = forked_child_reads()
    print(json.dumps(result))
''')


def test_a_forked_child_inherits_the_library_and_an_up_to_date_registry(tmp_path: Path) -> None:
    env = {**os.environ, "AIRFLOW_HOME": str(tmp_path / "airflow"),
           "HARVEST_PARTNERS_FILE": str(tmp_path / "partners.yaml"),
           "PYTHONPATH": os.pathsep.join([str(ROOT / "plugins"), str(ROOT)])}
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["library_loaded"] is True
    assert result["build_imports"] == []  # the asset URI handlers too (else about 170 modules per task)
    assert result["first"] == {"ids": ["alpha", "beta"], "parsed": 0}
    assert result["edited"] == {"ids": ["alpha", "beta", "gamma"], "parsed": 0}
