"""Papercuts of the harvest DAG seen in the UI: the first full harvest is deliberate, the
backfill form says what it ignores, the run shows its window, the docs read well."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, cast

import pytest

from include.simulators.oai_pmh import OaiSimulator, SimulatedRepository
from tests.support import dags
from tests.support.db import held as support_held
from tests.support.webhook import Sink, WebhookSink

if TYPE_CHECKING:
    from airflow.models.dagrun import DagRun
    from airflow.sdk.definitions.context import Context

pytestmark = pytest.mark.airflow
PARTNER = "firstmuseum"
CURSOR = f"harvest_cursor__{PARTNER}"


@pytest.fixture
def museum(registry: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch, aggregation_conn: str,
           airflow_db: None) -> Iterator[tuple[SimulatedRepository, WebhookSink]]:
    from airflow.models import Variable

    registry(
        "partners:\n"
        f"  - {{id: {PARTNER}, protocol: oai-pmh, conn_id: partner_{PARTNER}, metadata_prefix: oai_dc,\n"
        "     retries: 0, options: {http: {backoff_factor: 0.01, retries: 1}}}\n"
    )
    repo = SimulatedRepository(records=120, page_size=50, seed=7)
    sink = Sink()
    monkeypatch.setenv("AIRFLOW_CONN_HARVEST_ALERTS_WEBHOOK", json.dumps({"conn_type": "http", "host": sink.url}))
    Variable.delete(CURSOR)
    with OaiSimulator(repo) as sim:
        monkeypatch.setenv(f"AIRFLOW_CONN_PARTNER_{PARTNER.upper()}", json.dumps({"conn_type": "http", "host": sim.base_url}))
        yield repo, sink
    Variable.delete(CURSOR)
    sink.close()


build_dag = partial(dags.build_dag, PARTNER, None)  # the registry's retries
states = dags.task_states
held = partial(support_held, partner_id=PARTNER)


def succeeded(run: DagRun) -> bool:
    return str(getattr(run.state, "value", run.state)) == "success"




def cursor() -> dict | None:
    from airflow.models import Variable

    return Variable.get(CURSOR, default_var=None, deserialize_json=True)


def test_a_scheduled_run_never_starts_the_first_full_harvest(museum: tuple[SimulatedRepository, WebhookSink], db: str) -> None:
    repo, sink = museum
    when = datetime(2026, 3, 1, 2, tzinfo=timezone.utc)
    run = dags.dag_test_as(build_dag(), when, "scheduled")
    assert succeeded(run), states(run)  # no failure, so no alert
    assert set(states(run).values()) == {"skipped"}, states(run)
    assert held(db) == set() and cursor() is None
    assert sink.bodies == []

    # The deliberate act: a manual run harvests everything and sets the cursor ...
    manual = build_dag().test()
    assert succeeded(manual), states(manual)
    assert held(db) == repo.live_identifiers() and cursor() is not None

    # ... and from then on the scheduled runs harvest from it.
    repo.edit(3)
    later = dags.dag_test_as(build_dag(), datetime(2026, 3, 2, 2, tzinfo=timezone.utc), "scheduled")
    assert succeeded(later) and states(later)["advance_cursor"] == "success", states(later)
    assert held(db) == repo.live_identifiers()


def test_each_task_after_freeze_window_renders_the_window(museum: tuple[SimulatedRepository, WebhookSink], db: str) -> None:
    from airflow.models.renderedtifields import RenderedTaskInstanceFields
    from airflow.utils.session import create_session

    repo, _ = museum
    run = build_dag().test()
    assert succeeded(run), states(run)
    until = repo.clock.strftime("%Y-%m-%dT%H:%M:%SZ")
    with create_session() as session:
        rows = session.query(RenderedTaskInstanceFields).filter_by(dag_id=f"harvest_{PARTNER}", run_id=run.run_id).all()
        rendered = {row.task_id: row.rendered_fields for row in rows}
    for task_id in ("harvest_changes", "apply_changes", "advance_cursor", "check_quality"):
        assert rendered[task_id]["templates_dict"] == {
            "harvested_window": f"incremental: from the beginning .. {until} (seconds)"}, rendered[task_id]


def test_params_say_a_backfill_ignores_them() -> None:
    from partner_harvest.airflow.dag_factory import RUN_PARAMS

    mode = RUN_PARAMS["mode"]
    assert "backfill ignores" in mode.schema["title"] and "A backfill ignores Mode" in (mode.description or "")
    for name in ("from", "until"):
        assert "mode=window only" in RUN_PARAMS[name].schema["title"]
        assert "Ignored by the other modes and by backfills" in (RUN_PARAMS[name].description or "")
    # How a backfill's range maps, with an example, beside the Params (the form shows them).
    assert ("Backfill From 2024-11-01 To 2024-11-04 (nightly 02:00 schedule) makes the runs of Nov 1, 2 and 3, which "
            "harvest 2024-11-01T00:00Z .. 2024-11-04T00:00Z") in (mode.description or "")
    assert "such as 2024-11-01T00:00:00Z" in (RUN_PARAMS["from"].description or "")


def test_a_backfill_run_harvests_the_day_of_its_date() -> None:
    """From 2024-11-01 To 2024-11-04 harvested Oct 31 02:00 -> Nov 3 02:00 (each run its data
    interval, the day before the date in its name)."""
    from datetime import datetime, timezone
    from types import SimpleNamespace

    from partner_harvest.airflow.tasks import run_request

    tick = datetime(2024, 11, 1, 2, 0, tzinfo=timezone.utc)  # the run of Nov 1 of a nightly 02:00 schedule
    before = datetime(2024, 10, 31, 2, 0, tzinfo=timezone.utc)  # a backfill run's logical date: its interval's start
    context = {"dag_run": SimpleNamespace(run_type="backfill", run_after=tick), "logical_date": before,
               "data_interval_start": before, "data_interval_end": tick}
    request = run_request(cast("Context", context))
    assert (request.mode, request.requested_from, request.requested_until, request.may_advance_cursor) == (
        "window", datetime(2024, 11, 1, tzinfo=timezone.utc), datetime(2024, 11, 2, tzinfo=timezone.utc), False)


def test_dag_and_task_docs(registry: Callable[[str], Path]) -> None:
    from partner_harvest.airflow.dag_factory import build_dags

    registry("partners:\n  - {id: museum, protocol: oai-pmh, conn_id: c, lag: 10m, finish_by: '06:00'}\n"
             "  - {id: library, protocol: sierra, conn_id: d, lag: 90m, run_deadline: 1d}\n")
    dags = {d.dag_id: d for kind in ("harvest", "reconcile") for d in build_dags(kind)}
    museum, library = dags["harvest_museum"], dags["harvest_library"]
    assert "lag 10m," in (museum.doc_md or "") and "0:10:00" not in (museum.doc_md or "")
    assert "nightly runs due by 06:00 UTC" in (museum.doc_md or "") and "due by" not in (library.doc_md or "")
    assert "lag 1h 30m," in (library.doc_md or "") and "run deadline 1d after" in (library.doc_md or "")
    assert "poll_deletions" not in (museum.doc_md or "") and "poll_deletions" in (library.doc_md or "")
    for dag in (museum, library):
        assert "`check_quality`" in (dag.doc_md or "") and "**Params**" in (dag.doc_md or "")
        assert "**When a task fails**" in (dag.doc_md or "") and "clear the failed task" in (dag.doc_md or "")
        for task in dag.tasks:
            assert task.doc_md and len(task.doc_md) > 80, task.task_id
            assert "**Fails:**" in task.doc_md, task.task_id
    assert "**Fails:**" in (dags["reconcile_museum"].get_task("reconcile").doc_md or "")
