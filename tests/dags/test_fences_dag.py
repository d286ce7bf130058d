"""Operator commands fence runs planned before them (I14), through Airflow itself.

The measured case: a partner with 100 records and an applied run; its next run fails its
first try; while it waits for its retry (its lease lapsed: a retry waits up to 30 minutes,
a lease lives 5) the operator runs ``forget``; the retry must neither apply its
incremental window into the emptied partner nor set the cursor again. The same for
``reset-cursor --to`` between the apply and the cursor move.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from include.simulators.oai_pmh import OaiSimulator, SimulatedRepository
from partner_harvest.store import connect
from partner_harvest.store.db import scalar
from tests.support import dags
from tests.support.dags import task_states
from tests.support.db import held as support_held

if TYPE_CHECKING:
    from airflow.sdk import DAG

pytestmark = pytest.mark.airflow

PID = "fencemuseum"
TTL = timedelta(seconds=1)


class OnTask:
    """An Airflow listener: ``action`` once, when ``task_id`` fails a try (up_for_retry
    included) or succeeds, as ``event`` says. Errors are kept for the test to raise."""

    from airflow.listeners import hookimpl

    def __init__(self, event: str, task_id: str, action: Callable[[], object]) -> None:
        self.event, self.task_id, self.action, self.fired = event, task_id, action, 0
        self.errors: list[BaseException] = []
        self.failures: list[str] = []  # every failed try of the task, its error

    def _fire(self, task_instance: Any) -> None:
        if task_instance.task_id == self.task_id and not self.fired:
            self.fired += 1
            try:
                self.action()
            except BaseException as exc:  # the listener manager would only log it
                self.errors.append(exc)

    @hookimpl
    def on_task_instance_failed(self, previous_state: Any, task_instance: Any, error: Any) -> None:
        if task_instance.task_id == self.task_id:
            self.failures.append(str(error))
        if self.event == "failed":
            self._fire(task_instance)

    @hookimpl
    def on_task_instance_success(self, previous_state: Any, task_instance: Any) -> None:
        if self.event == "success":
            self._fire(task_instance)


OnTaskAdder = Callable[[str, str, Callable[[], object]], OnTask]  # the on_task fixture: (event, task_id, action)


@pytest.fixture
def on_task() -> Iterator[OnTaskAdder]:
    from airflow.sdk.listener import get_listener_manager

    manager = get_listener_manager()
    added: list[OnTask] = []

    def add(event: str, task_id: str, action: Callable[[], object]) -> OnTask:
        listener = OnTask(event, task_id, action)
        manager.add_listener(listener)
        added.append(listener)
        return listener

    yield add
    manager.clear()
    for listener in added:
        if listener.errors:
            raise listener.errors[0]


@pytest.fixture
def repo() -> SimulatedRepository:
    return SimulatedRepository(records=100, page_size=50, deleted_fraction=0.0, seed=23)


@pytest.fixture
def partner_env(registry: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch, aggregation_conn: str, repo: SimulatedRepository,
                airflow_db: None, airflow_api: str) -> Iterator[tuple[OaiSimulator, Path]]:
    from partner_harvest.airflow import tasks

    monkeypatch.setattr(tasks, "LEASE_TTL", TTL)  # a short lease, so a retry's wait outlives it quickly
    monkeypatch.delenv("HARVEST_DATABASE_URL", raising=False)
    path = registry(
        "partners:\n"
        f"  - {{id: {PID}, protocol: oai-pmh, conn_id: partner_{PID}, metadata_prefix: auto,\n"
        "     lag: 5m, options: {http: {backoff_factor: 0.01, retries: 0}}}\n"
    )
    with OaiSimulator(repo) as sim:
        monkeypatch.setenv(f"AIRFLOW_CONN_PARTNER_{PID.upper()}", json.dumps({"conn_type": "http", "host": sim.base_url}))
        set_cursor(None)
        yield sim, path
        set_cursor(None)


set_cursor = partial(dags.set_cursor, PID)
get_cursor = partial(dags.get_cursor, PID)
held = partial(support_held, partner_id=PID)


def build_dag(harvest_retries: int = 0) -> DAG:
    return dags.build_dag(PID, 0, harvest_retries=harvest_retries, retry_delay=timedelta(0))


def wait_until_the_lease_lapsed(db: str) -> None:
    """What a retry's wait does to the run's lease (nobody renews it): let it expire."""
    deadline = time.monotonic() + 10
    with connect(db) as conn:
        while scalar(conn.execute("SELECT count(*) FROM partner_leases WHERE partner_id = %s AND expires_at > now()",
                           (PID,))):
            conn.commit()
            assert time.monotonic() < deadline, "the lease never lapsed"
            time.sleep(0.05)


def cli(*argv: str) -> tuple[int, str]:
    import contextlib
    import io

    from partner_harvest.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        status = main(list(argv))
    return status, out.getvalue()


def test_forget_while_a_run_waits_for_its_retry_is_not_undone_by_the_retry(
        partner_env: tuple[OaiSimulator, Path], repo: SimulatedRepository, db: str,
        on_task: OnTaskAdder) -> None:
    sim, path = partner_env
    dag = build_dag(harvest_retries=1)
    first = dag.test()
    assert task_states(first)["advance_cursor"] == "success"
    assert len(held(db)) == 100 and get_cursor() is not None

    repo.advance_clock(3600)
    repo.edit(3)
    on_task("success", "plan_slices", lambda: sim.fail_next(1, status=500))  # the first try's list fails
    said: dict[str, str] = {}

    def forget() -> None:
        wait_until_the_lease_lapsed(db)
        status, said["forget"] = cli("forget", PID, "--yes", "--registry", str(path))
        assert status == 0, said["forget"]

    waited = on_task("failed", "harvest_changes", forget)
    second = dag.test()
    assert waited.fired == 1, "the first try did not fail"
    states = task_states(second)
    assert held(db) == set(), f"the retry applied {len(held(db))} records into the forgotten partner ({states})"
    assert get_cursor() is None, f"the retry set the cursor again: {get_cursor()} ({states})"
    assert states["harvest_changes"] == "failed" and states["apply_changes"] == "upstream_failed", states
    assert "fenced" in said["forget"] and second.run_id in said["forget"], said["forget"]
    assert len(waited.failures) == 2 and "`partner-harvest forget` changed this partner" in waited.failures[-1], \
        waited.failures

    # The next run harvests everything, as docs/operator/cli.md promises after a forget.
    third = build_dag().test()
    assert task_states(third)["advance_cursor"] == "success"
    assert held(db) == repo.live_identifiers()


def test_reset_cursor_between_the_apply_and_the_cursor_move_is_not_overwritten(partner_env: tuple[OaiSimulator, Path],
                                                                               repo: SimulatedRepository, db: str,
                                                                               on_task: OnTaskAdder) -> None:
    _, path = partner_env
    dag = build_dag()
    dag.test()
    repo.advance_clock(3600)
    repo.edit(3)
    said: dict[str, str] = {}

    def reset() -> None:
        wait_until_the_lease_lapsed(db)
        status, said["reset"] = cli("reset-cursor", PID, "--to", "2026-01-01", "--yes", "--registry", str(path))
        assert status == 0, said["reset"]

    on_task("success", "apply_changes", reset)
    run = dag.test()
    states = task_states(run)
    assert get_cursor()["until"] == "2026-01-01T00:00:00Z", f"the cursor move overwrote reset-cursor ({states})"
    assert states["advance_cursor"] == "failed", states
    assert "epoch of the partner" in said["reset"], said["reset"]
