"""harvest_<partner> run through Airflow itself (dag.test): cursor rules (I1) end to end."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path

import psycopg
import pytest

from include.simulators.oai_pmh import OaiSimulator, SimulatedRepository
from partner_harvest.store import connect
from partner_harvest.store.db import one, scalar
from tests.support import dags
from tests.support.dags import task_states
from tests.support.db import held as support_held

pytestmark = pytest.mark.airflow
DAGMUSEUM = "dagmuseum"  # its registry, Connection and simulator: tests/dags/conftest.py (partner_env)
set_cursor = partial(dags.set_cursor, DAGMUSEUM)
get_cursor = partial(dags.get_cursor, DAGMUSEUM)
build_dag = partial(dags.build_dag, DAGMUSEUM)
held = partial(support_held, partner_id=DAGMUSEUM)


def test_incremental_runs_move_the_cursor_and_match_the_partner(partner_env: OaiSimulator, repo: SimulatedRepository, db: str) -> None:
    dag = build_dag()
    first = dag.test()
    assert str(first.state) in ("success", "DagRunState.SUCCESS"), task_states(first)
    cursor = get_cursor()
    assert cursor["until"] == repo.clock.strftime("%Y-%m-%dT%H:%M:%SZ")
    assert held(db) == repo.live_identifiers()

    edited, deleted, added = repo.edit(8), repo.delete(4), repo.add(4)
    second = dag.test()
    assert task_states(second)["advance_cursor"] == "success"
    assert get_cursor()["until"] == repo.clock.strftime("%Y-%m-%dT%H:%M:%SZ")
    assert held(db) == repo.live_identifiers()
    with connect(db) as conn:
        fetched = scalar(conn.execute(
            "SELECT fetched FROM harvest_runs WHERE partner_id = 'dagmuseum' AND run_id = %s",
            (f"{second.dag_id}/{second.run_id}",),
        ))
    assert fetched == len(edited) + len(deleted) + len(added)


def test_window_run_leaves_the_cursor_alone(partner_env: OaiSimulator, repo: SimulatedRepository, db: str) -> None:
    set_cursor({"until": "2026-01-01T00:00:00Z"})
    repo.edit(5)
    run = build_dag().test(run_conf={"mode": "window", "from": "2025-01-01T00:00:00Z",
                                     "until": "2026-12-31T00:00:00Z"})
    assert task_states(run)["advance_cursor"] == "success"
    assert get_cursor() == {"until": "2026-01-01T00:00:00Z"}
    assert held(db) == repo.live_identifiers()


def test_full_run_leaves_the_cursor_alone(partner_env: OaiSimulator, repo: SimulatedRepository) -> None:
    set_cursor({"until": "2025-06-01T00:00:00Z"})
    run = build_dag().test(run_conf={"mode": "full"})
    assert task_states(run)["apply_changes"] == "success"
    assert get_cursor() == {"until": "2025-06-01T00:00:00Z"}


def test_failed_apply_keeps_the_cursor_and_a_rerun_completes(partner_env: OaiSimulator, repo: SimulatedRepository, db: str) -> None:
    dag = build_dag()
    dag.test()
    before_cursor = get_cursor()
    before = held(db)
    repo.advance_clock(3600)
    repo.delete(5)
    repo.edit(5)
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("CREATE FUNCTION boom() RETURNS trigger LANGUAGE plpgsql AS $$"
                     " BEGIN RAISE EXCEPTION 'simulated failure during apply'; END $$")
        conn.execute("CREATE TRIGGER boom BEFORE INSERT ON deletions FOR EACH ROW EXECUTE FUNCTION boom()")
    failed = dag.test()
    states = task_states(failed)
    assert states["apply_changes"] == "failed" and states["advance_cursor"] in ("upstream_failed", "None")
    assert get_cursor() == before_cursor
    assert held(db) == before  # nothing half-applied (I4)
    with psycopg.connect(db, autocommit=True) as conn:
        status, error = one(conn.execute(
            "SELECT status, error FROM harvest_runs WHERE run_id = %s", (f"{failed.dag_id}/{failed.run_id}",)))
        assert status == "failed" and "simulated failure during apply" in error
        conn.execute("DROP TRIGGER boom ON deletions")
    rerun = dag.test()
    assert task_states(rerun)["advance_cursor"] == "success"
    assert get_cursor()["until"] > before_cursor["until"]
    assert held(db) == repo.live_identifiers()


def test_partner_failure_fails_the_run_and_keeps_the_cursor(partner_env: OaiSimulator, repo: SimulatedRepository) -> None:
    dag = build_dag()
    dag.test()
    cursor = get_cursor()
    partner_env.repeat_token(True)
    run = build_dag().test(run_conf={"mode": "full"})  # several pages, so tokens repeat
    states = task_states(run)
    assert states["harvest_changes"] == "failed" and states["advance_cursor"] != "success"
    assert get_cursor() == cursor


def test_an_older_run_never_rewinds_the_cursor(partner_env: OaiSimulator, repo: SimulatedRepository) -> None:
    """A backfill or a late run finishing after a newer one leaves the newer cursor."""
    future = {"until": "2027-06-01T00:00:00Z"}
    set_cursor(future)
    run = build_dag().test()
    assert task_states(run)["advance_cursor"] == "success"
    assert get_cursor()["until"] == future["until"]


def test_non_retryable_errors_fail_at_once() -> None:
    from airflow.sdk.exceptions import AirflowFailException

    from partner_harvest.airflow.tasks import _fail_fast
    from partner_harvest.errors import ConfigurationError, PartnerHttpError
    from partner_harvest.reconcile import MassPurgeRefused
    from partner_harvest.registry import RegistryError

    def raising(exc: Exception) -> Callable[[], object]:
        return _fail_fast(lambda: (_ for _ in ()).throw(exc))

    for error in (ConfigurationError("p", "POST /token", "bad credentials"),
                  MassPurgeRefused("p", "reconcile", "too much"),
                  RegistryError("partners.yaml", "p", "lag", "bad")):
        with pytest.raises(AirflowFailException):
            raising(error)()
    with pytest.raises(PartnerHttpError):  # transient: left to the task's retries
        raising(PartnerHttpError("p", "GET /oai", "HTTP 503"))()


def test_a_long_retry_after_reschedules_the_harvest_which_then_lands_the_window(
        partner_env: OaiSimulator, repo: SimulatedRepository, db: str, registry: Callable[[str], Path],
        after_task: Callable[[str, Callable[[], object]], None]) -> None:
    """For OAI-PMH, through Airflow: a 503 asking for 3 s, longer than
    options.http.max_wait_in_task (1 s here), ends the harvest's try at once
    (UP_FOR_RESCHEDULE, no retry used, the worker slot free); dag.test() runs it again after
    the wait, and the window, started again from its frozen bounds, lands whole."""
    from airflow.models.taskinstance import TaskInstance
    from airflow.models.taskreschedule import TaskReschedule
    from airflow.utils.session import create_session

    registry(
        "partners:\n"
        "  - {id: dagmuseum, protocol: oai-pmh, conn_id: partner_dagmuseum, metadata_prefix: auto,\n"
        "     lag: 5m, options: {http: {backoff_factor: 0.01, retries: 2, max_wait_in_task: 1}}}\n"
    )
    wait = 3
    after_task("plan_slices", lambda: partner_env.fail_next(1, status=503, retry_after=wait))
    run = build_dag().test()
    assert set(task_states(run).values()) == {"success"}, task_states(run)
    with create_session() as session:
        ti = session.query(TaskInstance).filter_by(dag_id=run.dag_id, run_id=run.run_id,
                                                   task_id="harvest_changes").one()
        assert ti.try_number == 1  # a reschedule is not a retry
        reschedules = session.query(TaskReschedule).filter(TaskReschedule.ti_id == ti.id).all()
    assert len(reschedules) == 1
    first_try = reschedules[0]
    assert (first_try.end_date - first_try.start_date).total_seconds() < wait  # it did not sleep the wait
    assert (first_try.reschedule_date - first_try.end_date).total_seconds() >= wait - 1
    assert held(db) == repo.live_identifiers()
