"""`retrying`, from a real Airflow retry (not from seeded task states).

The partner's endpoint is down on the first try of ``freeze_window`` (a closed port), with
``retries: 1`` and a ``retry_delay`` long enough to look: Airflow (``dag.test()``, the
scheduler's own state machine) puts the task in ``up_for_retry`` in its metadata database.
While it waits, the health page (the app the api-server mounts, reading that database and
the aggregation) and ``partner-harvest status`` (a subprocess, the operator's command) both
say ``retrying`` with the first try's error. Then the partner is back, the retry runs, the
run succeeds and both say ``ok``. Observation polls with a deadline, never sleeps.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from include.simulators.oai_pmh import OaiSimulator, SimulatedRepository
from partner_harvest.registry import get_partner

if TYPE_CHECKING:
    from fastapi.testclient import TestClient

pytestmark = [pytest.mark.airflow, pytest.mark.slow]
PARTNER = "retrier"
CONN_ENV = f"AIRFLOW_CONN_PARTNER_{PARTNER.upper()}"
RETRY_DELAY = 25  # seconds the task waits in up_for_retry: the page and `status` are read meanwhile
OBSERVE_TIMEOUT = 120.0


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def poll(probe: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        result = probe()
        if result:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.2)  # the polling interval, not a synchronisation


def status_lines() -> list[str]:
    """`partner-harvest status` as an operator runs it (this environment: the test's Airflow)."""
    done = subprocess.run([sys.executable, "-m", "partner_harvest.cli", "status"], env=dict(os.environ),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.splitlines()


def page_row(client: TestClient) -> str:
    page = client.get("/").text
    return page[page.index(f'<tr data-partner="{PARTNER}"'):].split("</tr>")[0]


class Observer(threading.Thread):
    """While ``dag.test()`` runs in the main thread: wait for the real up_for_retry, bring the
    partner back, then read the page and `status` before the retry is due."""

    def __init__(self, client: TestClient, partner_url: str) -> None:
        super().__init__(daemon=True)
        self.client, self.partner_url = client, partner_url
        self.seen: dict[str, Any] = {}
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            from partner_harvest.airflow.health.source import latest_harvest_runs

            partner = get_partner(PARTNER)
            waiting = poll(lambda: (latest_harvest_runs([partner]).get(PARTNER) or _Nothing).waiting_tasks,
                           OBSERVE_TIMEOUT, f"a task of harvest_{PARTNER} in up_for_retry")
            began = time.monotonic()
            os.environ[CONN_ENV] = json.dumps({"conn_type": "http", "host": self.partner_url})  # the partner is back
            # The task's on_retry_callback records the try's error just after Airflow set
            # up_for_retry; until then the page says which task waits (store.health.newest_run).
            row = poll(lambda: (lambda r: r if "(freeze_window, attempt 1 of 2 failed" in r else None)(
                page_row(self.client)),
                       RETRY_DELAY / 2, "the first try's error on the health page")
            self.seen.update(waiting=waiting, task_states=_task_states(), row=row,
                             partner_page=self.client.get(f"/partner/{PARTNER}").text, status=status_lines())
            self.seen["still_waiting"] = bool(latest_harvest_runs([partner])[PARTNER].waiting_tasks)
            self.seen["seconds"] = time.monotonic() - began
        except BaseException as exc:  # reported by the main thread
            self.error = exc


class _Nothing:
    waiting_tasks = ()


def _task_states() -> dict[str, tuple[str, int]]:
    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session
    from sqlalchemy import func, select

    with create_session() as session:
        newest = session.scalar(select(func.max(DagRun.id)).where(DagRun.dag_id == f"harvest_{PARTNER}"))
        run_id = session.scalar(select(DagRun.run_id).where(DagRun.id == newest))
        rows = session.execute(select(TaskInstance.task_id, TaskInstance.state, TaskInstance.try_number).where(
            TaskInstance.dag_id == f"harvest_{PARTNER}", TaskInstance.run_id == run_id)).all()
    return {task: (str(getattr(state, "value", state)), tries) for task, state, tries in rows}


@pytest.mark.timeout(240)  # a real retry delay is waited out, with two dag.test() processes' start
def test_a_real_retry_reads_retrying_on_the_page_and_in_status(
        registry: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch, aggregation_conn: str, airflow_db: None) -> None:
    from fastapi.testclient import TestClient

    from partner_harvest.airflow.dag_factory import build_harvest_dag
    from partner_harvest.airflow.health import app as health_app

    registry(
        "partners:\n"
        f"  - {{id: {PARTNER}, protocol: oai-pmh, conn_id: partner_{PARTNER}, metadata_prefix: oai_dc,\n"
        f"     retries: 1, retry_delay: {RETRY_DELAY}s, max_retry_delay: {RETRY_DELAY}s,\n"
        "     options: {http: {backoff_factor: 0.01, retries: 1}}}\n"
    )
    down = closed_port()
    monkeypatch.setenv(CONN_ENV, json.dumps({"conn_type": "http", "host": f"http://127.0.0.1:{down}/oai"}))
    monkeypatch.setattr(health_app, "_require_user", lambda: (lambda: None))  # Airflow's login: test_health.py
    client = TestClient(health_app.create_app())
    repo = SimulatedRepository(records=30, page_size=50, seed=9)
    with OaiSimulator(repo) as sim:
        observer = Observer(client, sim.base_url)
        observer.start()
        run = build_harvest_dag(get_partner(PARTNER)).test()
        observer.join(timeout=OBSERVE_TIMEOUT)
    if observer.error is not None:
        raise observer.error
    seen = observer.seen

    # What Airflow itself recorded: the first try failed and waits for its retry.
    assert seen["waiting"] == ("freeze_window",)
    assert seen["task_states"]["freeze_window"] == ("up_for_retry", 1), seen["task_states"]
    assert seen["still_waiting"], f"the retry came before the page and `status` were read ({seen['seconds']:.0f}s)"

    # The health page: retrying, with the first try's short cause, the attempt and the next try.
    row = seen["row"]
    assert 'data-state="retrying"' in row, row
    state_cell = row[row.index('class="state-cell"'):row.index('class="last-run"')]
    short = f"connection refused at 127.0.0.1:{down} (freeze_window, attempt 1 of 2 failed; next try in {RETRY_DELAY}s"
    assert short in state_cell and "Failed to establish" not in state_cell, state_cell
    page = seen["partner_page"]  # the partner's own page: the cause in full
    assert 'id="state">retrying<' in page
    cause_line = page[page.index('id="cause"'):].split("</p>")[0]
    assert short in cause_line and "[Errno 111] Connection refused" in cause_line, cause_line

    # `partner-harvest status`: the same state, the same cause.
    lines = seen["status"]
    table_row = next(line for line in lines[2:] if line.startswith(f"{PARTNER} "))
    assert " retrying " in table_row, lines
    cause = next(line for line in lines if line.startswith(f"{PARTNER} retrying: "))
    assert cause.startswith(f"{PARTNER} retrying: {short}"), cause
    assert not any("metadata database not read" in line for line in lines), lines

    # The partner came back: the retry harvested the window, and both say ok.
    assert str(getattr(run.state, "value", run.state)) == "success"
    assert _task_states()["freeze_window"] == ("success", 2)
    assert 'data-state="ok"' in page_row(client)
    assert " ok " in next(line for line in status_lines()[2:] if line.startswith(f"{PARTNER} "))
