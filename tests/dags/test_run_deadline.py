"""A run that never finishes (a missing pool) is not silent: the run deadline alerts.

Airflow 3.3.2 never schedules a task whose pool is missing; it says so only in the
scheduler's log ("Tasks using non-existent pool ... will not be scheduled"), and the dag
processor does not raise the non-existent-pool DAG warning (``known_pools`` is never set:
"TODO: Set known_pool names on DagBag!" in dag_processing/processor.py). The DAGs carry a
``DeadlineAlert`` on ``DAGRUN_QUEUED_AT``; these tests drive Airflow's own deadline code:
creating the run writes the Deadline row, the scheduler's miss handling queues the
callback, and the executor's callback runner sends the alert through the alert webhook.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from tests.support.webhook import Sink, WebhookSink

pytestmark = pytest.mark.airflow


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


ROOT = Path(__file__).resolve().parents[2]
BUNDLE = "test-run-deadline"


@pytest.fixture
def sink(monkeypatch: pytest.MonkeyPatch) -> Iterator[WebhookSink]:
    s = Sink()
    monkeypatch.setenv("AIRFLOW_CONN_HARVEST_ALERTS_WEBHOOK", json.dumps({"conn_type": "http", "host": s.url}))
    yield s
    s.close()


def test_every_partner_dag_carries_the_run_deadline(registry: Callable[[str], Path], airflow_db: None) -> None:
    from partner_harvest.airflow.dag_factory import build_dags

    registry("partners:\n  - {id: slow, protocol: oai-pmh, conn_id: c, run_deadline: 3h}\n"
             "  - {id: usual, protocol: oai-pmh, conn_id: c}\n")
    dags = {d.dag_id: d for kind in ("harvest", "reconcile") for d in build_dags(kind)}
    for dag_id, hours in (("harvest_slow", 3), ("reconcile_slow", 3), ("harvest_usual", 20)):
        deadline = dags[dag_id].deadline
        assert isinstance(deadline, list)
        (alert,) = deadline
        assert alert.interval == timedelta(hours=hours)
        assert type(alert.reference).__name__ == "DagRunQueuedAtDeadline"
        assert alert.callback.path == "partner_harvest.airflow.notifiers.run_overdue_alert"


def test_missing_pool_run_alerts_when_its_deadline_passes(registry: Callable[[str], Path], sink: WebhookSink, airflow_db: None) -> None:
    import structlog
    from airflow.dag_processing.dagbag import BundleDagBag, sync_bag_to_db
    from airflow.models import DagRun, Deadline
    from airflow.models.callback import Callback
    from airflow.models.dagbundle import DagBundleModel
    from airflow.models.pool import Pool
    from airflow.models.serialized_dag import SerializedDagModel
    from airflow.sdk.execution_time.callback_supervisor import execute_callback
    from airflow.utils.session import create_session
    from airflow.utils.state import CallbackState, DagRunState
    from airflow.utils.types import DagRunTriggeredByType, DagRunType

    registry("partners:\n  - {id: poolless, protocol: oai-pmh, conn_id: c, run_deadline: 2h}\n")
    with create_session() as session:
        assert Pool.get_pool("partner_poolless", session=session) is None  # the operator forgot it
        if session.get(DagBundleModel, BUNDLE) is None:
            session.add(DagBundleModel(name=BUNDLE))
    bag = BundleDagBag(dag_folder=str(ROOT / "dags" / "partner_harvest.py"), bundle_path=ROOT / "dags",
                       bundle_name=BUNDLE)
    assert "harvest_poolless" in bag.dag_ids and not bag.import_errors
    sync_bag_to_db(bag, BUNDLE, None)

    run_id = f"manual__deadline_{utcnow().timestamp():.0f}"
    with create_session() as session:
        dag = SerializedDagModel.get_dag("harvest_poolless", session=session)
        assert dag is not None
        now = utcnow()
        run = dag.create_dagrun(run_id=run_id, logical_date=now, data_interval=(now, now), run_after=now,
                                run_type=DagRunType.MANUAL, triggered_by=DagRunTriggeredByType.TEST,
                                state=DagRunState.QUEUED, session=session)
        session.flush()
        (deadline,) = session.query(Deadline).filter(Deadline.dagrun_id == run.id).all()
        assert run.queued_at is not None and deadline.deadline_time == run.queued_at + timedelta(hours=2)
        # Two hours later, nothing has run (no pool); what the scheduler loop does then:
        deadline.deadline_time = utcnow() - timedelta(seconds=1)
        session.flush()
        for missed in session.query(Deadline).filter(Deadline.deadline_time < utcnow(), ~Deadline.missed,
                                                     Deadline.dagrun_id == run.id):
            missed.handle_miss(session)
        session.flush()
        callback = session.get(Callback, deadline.callback_id)
        assert callback is not None and callback.state == CallbackState.PENDING
        data = dict(callback.data)
        assert getattr(session.get(DagRun, run.id), "state", None) == DagRunState.QUEUED

    # What the executor's callback runner does with it.
    ok, error = execute_callback(data["path"], data["kwargs"], Path("partner_harvest.py"), ROOT / "dags",
                                 structlog.get_logger())
    assert (ok, error) == (True, None)
    (body,) = sink.bodies
    assert body["harvest"]["kind"] == "overdue" and body["harvest"]["run_id"] == run_id
    assert "harvest_poolless" in body["text"] and "not finished 2:00:00 after it was queued" in body["text"]
    assert "pool partner_poolless exists" in body["text"]
