"""harvest_<sierra partner> through Airflow (dag.test): both cursors, and no secret anywhere."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from include.simulators.sierra import SierraSimulator, SimulatedCatalogue
from partner_harvest.store import connect, ensure_schema
from partner_harvest.store.admin import live_identifiers
from tests.support import dags

pytestmark = pytest.mark.airflow

KEY, SECRET = "dag-key", "dag-secret-never-logged-7Q"
CURSOR, DELETIONS = "harvest_cursor__daglibrary", "harvest_cursor__daglibrary__deletions"


@pytest.fixture
def catalogue(request: pytest.FixtureRequest) -> SimulatedCatalogue:
    extra = getattr(request, "param", {})  # switches of the simulator, for one test
    return SimulatedCatalogue(bibs=300, deleted_fraction=0.03, seed=21, **extra)


def library_entry(export: str) -> str:
    """The registry of these tests: one Sierra partner, its export options given."""
    return ("partners:\n"
            "  - id: daglibrary\n"
            "    protocol: sierra\n"
            "    conn_id: partner_daglibrary\n"
            "    page_size: 100\n"
            f"    options: {{http: {{backoff_factor: 0.01, retries: 2}}, export: {export}}}\n")


@pytest.fixture
def sierra_env(registry: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch, aggregation_conn: str, catalogue: SimulatedCatalogue,
               airflow_db: None) -> Iterator[SierraSimulator]:
    registry(library_entry("{limit: 100, rate_limit_wait: 0}"))
    with SierraSimulator(catalogue, client_key=KEY, client_secret=SECRET) as sim:
        monkeypatch.setenv("AIRFLOW_CONN_PARTNER_DAGLIBRARY", json.dumps(
            {"conn_type": "http", "host": sim.base_url, "login": KEY, "password": SECRET}))
        from airflow.models import Variable

        for key in (CURSOR, DELETIONS):
            Variable.delete(key)
        yield sim
        for key in (CURSOR, DELETIONS):
            Variable.delete(key)


def variable(key: str) -> Any:
    from airflow.models import Variable

    return Variable.get(key, default_var=None, deserialize_json=True)


build_dag = partial(dags.build_dag, "daglibrary")


def xcom_text(dag_id: str) -> str:
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        rows = session.query(XComModel).filter(XComModel.dag_id == dag_id).all()
        return " ".join(json.dumps(row.value, default=str) for row in rows)


def rendered_fields_text(dag_id: str) -> str:
    from airflow.models.renderedtifields import RenderedTaskInstanceFields
    from airflow.utils.session import create_session

    with create_session() as session:
        rows = session.query(RenderedTaskInstanceFields).filter(RenderedTaskInstanceFields.dag_id == dag_id).all()
        return " ".join(json.dumps(row.rendered_fields, default=str) for row in rows)


def test_sierra_dag_moves_both_cursors_and_never_shows_the_secret(sierra_env: SierraSimulator, catalogue: SimulatedCatalogue, db: str,
                                                                  capfd: pytest.CaptureFixture[str],
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    dag = build_dag()
    assert {"freeze_window", "plan_slices", "harvest_changes", "poll_deletions", "approval_gate", "apply_changes",
            "advance_cursor", "check_quality"} == set(dag.task_ids)
    assert dag.get_task("apply_changes").upstream_task_ids == {"freeze_window", "harvest_changes", "poll_deletions",
                                                               "approval_gate"}

    first = dag.test()
    states = {ti.task_id: str(getattr(ti.state, "value", ti.state)) for ti in first.get_task_instances()}
    assert set(states.values()) == {"success"}, states
    clock = catalogue.clock
    assert variable(CURSOR)["until"] == clock.strftime("%Y-%m-%dT%H:%M:%SZ")
    assert variable(DELETIONS)["until"] == clock.strftime("%Y-%m-%dT00:00:00Z")

    catalogue.advance_clock(86400 * 2)
    catalogue.edit(6)
    deleted = catalogue.delete(4)
    catalogue.add(3)
    second = dag.test()
    states = {ti.task_id: str(getattr(ti.state, "value", ti.state)) for ti in second.get_task_instances()}
    assert set(states.values()) == {"success"}, states
    with connect(db) as conn:
        ensure_schema(conn)
        assert live_identifiers(conn, "daglibrary") == catalogue.public_ids()
        channels: dict[str, int] = dict(conn.execute(
            "SELECT channel, purged FROM harvest_runs WHERE partner_id = 'daglibrary' AND run_id = %s",
            (f"{second.dag_id}/{second.run_id}",)).fetchall())
    assert channels == {"changes": 0, "deletions": len(deleted)}
    assert variable(DELETIONS)["until"] == catalogue.clock.strftime("%Y-%m-%dT00:00:00Z")

    output = capfd.readouterr()
    logged = output.out + output.err + caplog.text
    assert "obtained an access token" in logged and "export page" in logged  # task logs were captured
    bearer_tokens = list(sierra_env._tokens)  # every access token the API handed out
    assert bearer_tokens
    stored = xcom_text("harvest_daglibrary") + rendered_fields_text("harvest_daglibrary")
    for secret in (SECRET, *bearer_tokens):
        assert secret not in logged and secret not in stored


@pytest.mark.parametrize("catalogue", [{"nul_every": 50}], indirect=True)
def test_bibs_holding_a_nul_character_are_quarantined_and_the_run_completes(sierra_env: SierraSimulator, catalogue: SimulatedCatalogue,
                                                                            db: str) -> None:
    """Regression, through Airflow: a NUL made the page's COPY fail on every retry, for ever."""
    run = build_dag().test()
    states = {ti.task_id: str(getattr(ti.state, "value", ti.state)) for ti in run.get_task_instances()}
    assert set(states.values()) == {"success"}, states
    poisoned = {str(n) for n in range(catalogue.first_id, catalogue.first_id + 300)
                if catalogue._every(catalogue.nul_every, n) and str(n) in catalogue.public_ids()}
    assert poisoned
    with connect(db) as conn:
        ensure_schema(conn)
        assert live_identifiers(conn, "daglibrary") == catalogue.public_ids() - poisoned
        held: dict[str, str] = dict(conn.execute("SELECT identifier, reason FROM quarantine WHERE partner_id = 'daglibrary'").fetchall())
    assert set(held) == poisoned
    assert all("NUL" in reason or "XML compatible" in reason for reason in held.values()), held
    assert variable(CURSOR)["until"] == catalogue.clock.strftime("%Y-%m-%dT%H:%M:%SZ")


def test_a_rate_limit_reschedules_harvest_changes_which_then_resumes_at_the_stopped_block(
        sierra_env: SierraSimulator, catalogue: SimulatedCatalogue, db: str, registry: Callable[[str], Path]) -> None:
    """Through Airflow: a 429 whose Retry-After is longer than options.export.max_sleep_seconds
    frees the worker slot (the try ends at once, UP_FOR_RESCHEDULE, no retry used); dag.test() runs the task
    again after reschedule_date and the export resumes after the staged blocks."""
    from airflow.models.taskinstance import TaskInstance
    from airflow.models.taskreschedule import TaskReschedule
    from airflow.utils.session import create_session

    registry(library_entry("{limit: 50, max_sleep_seconds: 0}"))
    wait = 5
    sierra_env.rate_limit_once(after=2, seconds=wait, style="429")  # the 3rd of 6 blocks
    run = build_dag().test()
    states = {ti.task_id: str(getattr(ti.state, "value", ti.state)) for ti in run.get_task_instances()}
    assert set(states.values()) == {"success"}, states
    with create_session() as session:
        ti = session.query(TaskInstance).filter_by(dag_id=run.dag_id, run_id=run.run_id, task_id="harvest_changes").one()
        assert ti.try_number == 1  # a reschedule is not a retry
        reschedules = session.query(TaskReschedule).filter(TaskReschedule.ti_id == ti.id).all()
    assert len(reschedules) == 1
    first_try = reschedules[0]
    assert (first_try.end_date - first_try.start_date).total_seconds() < wait / 2  # it did not sleep the wait
    assert (first_try.reschedule_date - first_try.end_date).total_seconds() >= wait - 1
    assert ti.start_date is not None and ti.start_date >= first_try.reschedule_date  # the second try ran after the wait
    exports = [r for r in sierra_env.requests if r["path"].endswith("/bibs/marc")]
    assert [r["status"] for r in exports].count(429) == 1
    served = [r["query"]["id"] for r in exports if r["status"] == 200]
    assert len(served) == len(set(served)) and len(served) <= 6 + 1  # no block twice; +1 for the shifted keyset
    with connect(db) as conn:
        ensure_schema(conn)
        assert live_identifiers(conn, "daglibrary") == catalogue.public_ids()
        check = conn.execute("SELECT check_ok, attempts FROM harvest_runs WHERE partner_id = 'daglibrary'"
                             " AND channel = 'changes'").fetchone()
    assert check == (True, 2)


@pytest.mark.timeout(600)  # three dag.test() runs of eleven tasks, on a loaded machine
def test_items_and_holdings_get_their_tasks_and_cursors_and_a_quiet_night_applies_them_all_in_freeze(
        registry: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch, aggregation_conn: str, airflow_db: None, db: str) -> None:
    registry("partners:\n  - id: itemlibrary\n    protocol: sierra\n    conn_id: partner_itemlibrary\n"
             "    page_size: 100\n    lag: 1m\n    options: {http: {backoff_factor: 0.01, retries: 2}, export: {limit: 100, "
             "rate_limit_wait: 0}, sierra: {channels: [bibs, items, holdings]}}\n")
    catalogue = SimulatedCatalogue(bibs=120, deleted_fraction=0.0, seed=22)
    items = catalogue.attach("items", 300, deleted_fraction=0.0)
    catalogue.attach("holdings", 20, deleted_fraction=0.0)
    keys = [f"harvest_cursor__itemlibrary{suffix}" for suffix in
            ("", "__deletions", "__items", "__item_deletions", "__holdings", "__holding_deletions")]
    from airflow.models import Variable

    with SierraSimulator(catalogue, client_key=KEY, client_secret=SECRET) as sim:
        monkeypatch.setenv("AIRFLOW_CONN_PARTNER_ITEMLIBRARY", json.dumps(
            {"conn_type": "http", "host": sim.base_url, "login": KEY, "password": SECRET}))
        for key in keys:
            Variable.delete(key)
        dag = dags.build_dag("itemlibrary")
        polls = {"poll_deletions", "poll_items", "poll_item_deletions", "poll_holdings", "poll_holding_deletions"}
        assert polls <= set(dag.task_ids) and dag.get_task("approval_gate").upstream_task_ids == {"harvest_changes",
                                                                                                   *polls}

        def night() -> dict[str, str]:
            run = dag.test()
            return {ti.task_id: str(getattr(ti.state, "value", ti.state)) for ti in run.get_task_instances()}

        assert set(night().values()) == {"success"}  # the load: bibs exported, items and holdings listed
        assert all(variable(key) for key in keys)  # every channel's own cursor
        catalogue.advance_clock(86400 * 2)
        assert set(night().values()) == {"success"}  # nothing changed, nothing fetched: every poll ran
        catalogue.advance_clock(86400)
        states = night()
        # a quiet night: freeze applies it (every poll looked at once), every other task skipped
        assert states["freeze_window"] == "success" and states["poll_items"] == "skipped", states
        with connect(db) as conn:
            held = {i: tuple(b) for i, b in conn.execute(
                "SELECT identifier, bib_ids FROM items WHERE partner_id = 'itemlibrary'").fetchall()}
        assert held == items.live(public_only=True)
        for key in keys:
            Variable.delete(key)
