"""A backfill of days after the partner's clock harvests nothing, and says
so: its freeze_window skips the run (every task skipped, no harvest_runs row), the reason
is the first warning of the task's log, right after the window it froze, and the health
page shows it beside the partner's state, while "Last night" keeps the real harvest.

Through Airflow itself: ``dag.test()`` with the run made a backfill run (Airflow's
``backfill`` run type and its data interval, as ``airflow backfill create`` makes it).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from include.simulators.oai_pmh import OaiSimulator, SimulatedRepository
from partner_harvest.registry import get_partner
from partner_harvest.store import connect, ensure_schema
from partner_harvest.store.db import scalar
from tests.support.dags import dag_test_as

if TYPE_CHECKING:
    from airflow.models.dagrun import DagRun
    from airflow.sdk import DAG

pytestmark = pytest.mark.airflow
PARTNER = "backfilled"


@pytest.fixture
def museum(registry: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch, aggregation_conn: str,
           airflow_db: None) -> Iterator[tuple[SimulatedRepository, Path]]:
    from airflow.models import Variable

    path = registry(
        "partners:\n"
        f"  - {{id: {PARTNER}, protocol: oai-pmh, conn_id: partner_{PARTNER}, metadata_prefix: oai_dc,\n"
        "     retries: 0, options: {http: {backoff_factor: 0.01, retries: 1}}}\n"
    )
    repo = SimulatedRepository(records=60, page_size=50, seed=3)  # its clock stands at 2026-01-01
    Variable.delete(f"harvest_cursor__{PARTNER}")
    with OaiSimulator(repo) as sim:
        monkeypatch.setenv(f"AIRFLOW_CONN_PARTNER_{PARTNER.upper()}", json.dumps({"conn_type": "http", "host": sim.base_url}))
        yield repo, path
    Variable.delete(f"harvest_cursor__{PARTNER}")


def build_dag() -> DAG:
    from partner_harvest.airflow.dag_factory import build_harvest_dag

    return build_harvest_dag(get_partner(PARTNER))


def states(run: DagRun) -> dict[str, str]:
    return {ti.task_id: str(getattr(ti.state, "value", ti.state)) for ti in run.get_task_instances()}




def test_a_backfill_after_the_partners_clock_skips_saying_why(museum: tuple[SimulatedRepository, Path], db: str,
                                                              caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    repo, _ = museum
    first = build_dag().test()  # the real harvest: everything, up to the partner's clock
    assert str(getattr(first.state, "value", first.state)) == "success", states(first)

    day = repo.clock.replace(hour=0, minute=0, second=0, microsecond=0) + timedelta(days=40)
    with caplog.at_level(logging.INFO, logger="partner_harvest"):
        run = dag_test_as(build_dag(), day, "backfill")
    assert str(getattr(run.state, "value", run.state)) == "success", states(run)  # no failure, no alert
    assert set(states(run).values()) == {"skipped"}, states(run)

    # The task's log: the window it froze, then at once why nothing follows.
    messages = [r.getMessage() for r in caplog.records if r.name.startswith("partner_harvest")]
    start = f"{day:%Y-%m-%dT%H:%M:%SZ}"  # the run's window: the day of its date
    frozen = next(i for i, m in enumerate(messages) if m.startswith(f"{PARTNER}: frozen ") and start in m)
    reason = messages[frozen + 1]
    assert reason.startswith(f"SKIPPED: {PARTNER}: nothing to harvest: this backfill run's window "), messages
    assert "starts after the partner's clock (2026-01-01T00:00:00Z)" in reason and reason.endswith("This run is skipped.")

    with connect(db) as conn:
        ensure_schema(conn)
        audit = scalar(conn.execute("SELECT count(*) FROM harvest_runs WHERE run_id = %s",
                             (f"{run.dag_id}/{run.run_id}",)))
        event = conn.execute("SELECT kind, task_id, message FROM run_events WHERE run_id = %s",
                             (f"{run.dag_id}/{run.run_id}",)).fetchall()
    assert audit == 0  # nothing was harvested, so "Last night" keeps the real harvest
    assert event == [("empty", "freeze_window", reason.removeprefix("SKIPPED: "))]

    # The health page: the reason beside the state; the real harvest's figures stay.
    from fastapi.testclient import TestClient

    from partner_harvest.airflow.health import app as health_app
    from partner_harvest.airflow.health import source

    monkeypatch.setattr(source, "connection", lambda: connect(db))
    monkeypatch.setattr(health_app, "_require_user", lambda: (lambda: None))  # Airflow's login: test_health.py
    page = TestClient(health_app.create_app()).get("/").text
    row = page[page.index(f'<tr data-partner="{PARTNER}"'):].split("</tr>")[0]
    state_cell = row[row.index('class="state-cell"'):row.index('class="last-run"')]
    assert "nothing to harvest: this backfill run&#39;s window" in state_cell, state_cell
    last_night = row[row.index('class="num last-night"'):].split("</td>")[0]
    assert f">{len(repo.live_identifiers())} / 0 / " in last_night, last_night
