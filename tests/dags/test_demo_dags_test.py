"""The demo (and operators) run partner DAGs with `airflow dags test`; Airflow 3.3.2's
exits 1 after a successful run of a DAG with a deadline (apache/airflow#73428), so the
demo stopped after its first run. partner_harvest/airflow/compat.py works around it
wherever the DAG factory builds a deadline."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from include.simulators.oai_pmh import OaiSimulator, SimulatedRepository

pytestmark = pytest.mark.airflow
ROOT = Path(__file__).resolve().parents[2]


def test_dags_test_of_a_dag_with_a_deadline_exits_0_and_the_run_succeeds(registry: Callable[[str], Path], aggregation_conn: str,
                                                                         airflow_db: None, monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.models import DagRun, Variable
    from airflow.utils.session import create_session

    registry("partners:\n  - {id: clidemo, protocol: oai-pmh, conn_id: partner_clidemo, metadata_prefix: oai_dc,\n"
             "     retries: 0, options: {http: {backoff_factor: 0.01, retries: 1}}}\n")
    Variable.delete("harvest_cursor__clidemo")
    with OaiSimulator(SimulatedRepository(records=40, page_size=20, seed=2)) as sim:
        monkeypatch.setenv("AIRFLOW_CONN_PARTNER_CLIDEMO", json.dumps({"conn_type": "http", "host": sim.base_url}))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "plugins"), str(ROOT)])}
        done = subprocess.run([sys.executable, "-m", "airflow", "dags", "test", "harvest_clidemo"],
                              env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    Variable.delete("harvest_cursor__clidemo")
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    with create_session() as session:
        newest = session.query(DagRun).filter(DagRun.dag_id == "harvest_clidemo").order_by(DagRun.id.desc()).first()
        assert newest is not None and str(getattr(newest.state, "value", newest.state)) == "success"
