"""Airflow for DAG tests: a private AIRFLOW_HOME with a migrated metadata DB (``airflow_db``,
tests/conftest.py)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from psycopg.conninfo import conninfo_to_dict

from include.simulators.oai_pmh import OaiSimulator, SimulatedRepository
from tests.support.dags import set_cursor
from tests.support.webhook import WebhookSink

if TYPE_CHECKING:
    from airflow.dag_processing.dagbag import DagBag

ROOT = Path(__file__).resolve().parents[2]

# dag.test() parses DAG files in this process under a SIGALRM timer of its own, which
# would cancel the test's time limit (pytest-timeout, signal method; see pytest.ini).
os.environ.setdefault("AIRFLOW__CORE__DAGBAG_IMPORT_TIMEOUT", "0")


@pytest.fixture(scope="session")
def dagbag(airflow_db: None) -> DagBag:
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(ROOT / "dags"))


@pytest.fixture(scope="session")
def airflow_api_url(airflow_db: None) -> Iterator[str]:
    """Airflow's REST API in this process over the tests' metadata database: what the
    command line talks to."""
    from tests.support.airflow_stack import airflow_rest_api

    with airflow_rest_api() as url:
        yield url


@pytest.fixture
def airflow_api(airflow_api_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The command line pointed at :func:`airflow_api_url` (a fresh client for this test)."""
    from partner_harvest.airflow import api

    monkeypatch.setenv(api.URL_ENV, airflow_api_url)
    api.api_client.cache_clear()
    yield airflow_api_url
    api.api_client.cache_clear()


@pytest.fixture
def aggregation_conn(monkeypatch: pytest.MonkeyPatch, db: str) -> str:
    """Point the Connection `aggregation_db` at this test's fresh database."""
    pg = conninfo_to_dict(db)
    monkeypatch.setenv("AIRFLOW_CONN_AGGREGATION_DB", json.dumps({
        "conn_type": "postgres", "host": pg.get("host"), "port": int(pg.get("port") or 5432),
        "login": pg.get("user"), "password": pg.get("password") or None, "schema": pg["dbname"],
    }))
    return db


@pytest.fixture
def registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[str], Path]:
    """Write a registry for this test and point HARVEST_PARTNERS_FILE at it."""

    def write(body: str) -> Path:
        path = tmp_path / "partners.yaml"
        path.write_text(body)
        monkeypatch.setenv("HARVEST_PARTNERS_FILE", str(path))
        return path

    return write


@pytest.fixture(autouse=True)
def no_task_execution_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    """Leave SIGALRM to pytest-timeout: dag.test() runs tasks in this process, and a task's
    execution_timeout arms (then disarms) a SIGALRM timer of its own around the task,
    which would silently cancel the test's time limit (pytest.ini)."""
    from partner_harvest.airflow import dag_factory

    monkeypatch.setitem(dag_factory.DEFAULT_ARGS, "execution_timeout", None)


@pytest.fixture
def webhook() -> Iterator[WebhookSink]:
    sink = WebhookSink()
    yield sink
    sink.close()


class AfterTask:
    """An Airflow listener that runs ``action`` once, right after ``task_id`` succeeded."""

    def __init__(self, task_id: str, action: Callable[[], object]) -> None:
        self.task_id, self.action, self.fired = task_id, action, 0

    from airflow.listeners import hookimpl

    @hookimpl
    def on_task_instance_success(self, previous_state: Any, task_instance: Any) -> None:
        if task_instance.task_id == self.task_id and not self.fired:
            self.fired += 1
            self.action()


@pytest.fixture
def after_task() -> Iterator[Callable[[str, Callable[[], object]], None]]:
    """``after_task(task_id, action)``: run ``action`` once, right after that task succeeded
    in this test's ``dag.test()`` (an Airflow listener, removed after the test)."""
    from airflow.sdk.listener import get_listener_manager

    manager = get_listener_manager()

    def add(task_id: str, action: Callable[[], object]) -> None:
        manager.add_listener(AfterTask(task_id, action))

    yield add
    manager.clear()


@pytest.fixture
def repo() -> SimulatedRepository:
    """The collection of partner 'dagmuseum' (test_harvest_dag_run, test_cursor_monotonic)."""
    from include.simulators.oai_pmh import SimulatedRepository

    return SimulatedRepository(records=400, page_size=100, seed=11)


@pytest.fixture
def partner_env(registry: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch, aggregation_conn: str, repo: SimulatedRepository,
                airflow_db: None) -> Iterator[OaiSimulator]:
    """Registry, Connections and a clean cursor for partner 'dagmuseum'."""
    from include.simulators.oai_pmh import OaiSimulator

    registry(
        "partners:\n"
        "  - {id: dagmuseum, protocol: oai-pmh, conn_id: partner_dagmuseum, metadata_prefix: auto,\n"
        "     lag: 5m, options: {http: {backoff_factor: 0.01, retries: 2}}}\n"
    )
    with OaiSimulator(repo) as sim:
        monkeypatch.setenv("AIRFLOW_CONN_PARTNER_DAGMUSEUM", json.dumps({"conn_type": "http", "host": sim.base_url}))
        set_cursor("dagmuseum", None)
        yield sim
        set_cursor("dagmuseum", None)
