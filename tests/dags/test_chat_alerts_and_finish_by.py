"""Alerts reach chat tools through Apprise, and a nightly harvest still running at the
registry's ``finish_by`` alerts (Airflow's DeadlineAlert on the run's logical date)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from partner_harvest.airflow.notifiers import _instant, run_late_alert, send_alert
from partner_harvest.registry import get_partner, load_registry
from tests.support.airflow_stack import free_loopback_port as closed_port  # nothing listens there
from tests.support.webhook import TOKEN, Sink, WebhookSink

pytestmark = pytest.mark.airflow
ROOT = Path(__file__).resolve().parents[2]
BUNDLE = "test-finish-by"


def apprise_connection(monkeypatch: pytest.MonkeyPatch, url: str) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_HARVEST_ALERTS_APPRISE", json.dumps(
        {"conn_type": "apprise", "extra": {"config": {"path": url, "tag": "alerts"}}}))


@pytest.fixture
def chat(monkeypatch: pytest.MonkeyPatch) -> Iterator[WebhookSink]:
    """A chat service stand-in: Apprise's json:// URL at a loopback sink (token in the path)."""
    monkeypatch.delenv("AIRFLOW_CONN_HARVEST_ALERTS_WEBHOOK", raising=False)
    sink = Sink()
    apprise_connection(monkeypatch, sink.url.replace("http://", "json://"))
    yield sink
    sink.close()


def test_apprise_url_receives_the_alert(chat: WebhookSink) -> None:
    sent = send_alert("[partner harvest] p: harvest_p.apply_changes failed (try 1)",
                      ["Partner: p", "Cause: boom"], {"kind": "failure", "partner": "p"})
    assert sent == ["apprise"]
    (body,) = chat.bodies
    assert body["title"] == "[partner harvest] p: harvest_p.apply_changes failed (try 1)"
    assert body["message"] == "Partner: p\nCause: boom" and body["type"] == "failure"


def test_a_failing_task_alerts_through_apprise(chat: WebhookSink, registry: Callable[[str], Path], aggregation_conn: str, airflow_db: None,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from partner_harvest.airflow.dag_factory import build_harvest_dag

    registry("partners:\n  - {id: chatmuseum, protocol: oai-pmh, conn_id: partner_chatmuseum, retries: 0,\n"
             "     options: {http: {retries: 0, connect_timeout: 2}}}\n")
    monkeypatch.setenv("AIRFLOW_CONN_PARTNER_CHATMUSEUM", json.dumps(
        {"conn_type": "http", "host": f"http://127.0.0.1:{closed_port()}/oai"}))
    run = build_harvest_dag(get_partner("chatmuseum")).test()
    assert str(getattr(run.state, "value", run.state)) == "failed"
    (body,) = chat.bodies
    assert body["title"].startswith("[partner harvest] chatmuseum: harvest_chatmuseum.freeze_window failed")
    assert "Partner: chatmuseum" in body["message"] and "verb=Identify" in body["message"]


def test_a_failing_apprise_service_is_logged_without_its_url(monkeypatch: pytest.MonkeyPatch,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.delenv("AIRFLOW_CONN_HARVEST_ALERTS_WEBHOOK", raising=False)
    apprise_connection(monkeypatch, f"json://127.0.0.1:{closed_port()}/hooks/T0/B0/{TOKEN}")
    with caplog.at_level(logging.DEBUG):  # Apprise logs the URL it posts to at DEBUG
        sent = send_alert("[partner harvest] p: failed", ["Partner: p"], {"kind": "failure", "partner": "p"})
    assert sent == []
    assert any("could not send the apprise alert" in r.getMessage() for r in caplog.records)
    logged = "\n".join(r.getMessage() for r in caplog.records) + caplog.text
    assert TOKEN not in logged


def test_an_unknown_apprise_scheme_is_reported(monkeypatch: pytest.MonkeyPatch,
                                               caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.delenv("AIRFLOW_CONN_HARVEST_ALERTS_WEBHOOK", raising=False)
    apprise_connection(monkeypatch, "nosuchservice://x/y")
    with caplog.at_level(logging.INFO):
        assert send_alert("s", ["l"], {"kind": "failure"}) == []
    assert any("not understood by Apprise" in r.getMessage() for r in caplog.records)


# -- finish_by ----------------------------------------------------------------------------

def test_finish_by_is_an_offset_from_the_schedule(registry: Callable[[str], Path]) -> None:
    path = registry(
        "partners:\n"
        "  - {id: early, protocol: oai-pmh, conn_id: c, finish_by: '06:00'}\n"
        "  - {id: overnight, protocol: oai-pmh, conn_id: c, schedule: '30 22 * * *', finish_by: '02:15'}\n"
        "  - {id: hourly, protocol: oai-pmh, conn_id: c, schedule: '0 * * * *', finish_by: '06:00'}\n"
        "  - {id: sloppy, protocol: oai-pmh, conn_id: c, finish_by: '6:00'}\n"
    )
    loaded = load_registry(path)
    offsets = {p.id: p.finish_by_offset for p in loaded.partners}
    assert offsets == {"early": timedelta(hours=4), "overnight": timedelta(hours=3, minutes=45)}
    errors = {e.partner: str(e) for e in loaded.errors}
    assert "one time of day" in errors["hourly"] and "finish_by" in errors["sloppy"]


def test_late_alert_only_for_a_scheduled_run_still_unfinished(chat: WebhookSink) -> None:
    kwargs = {"partner_id": "p", "dag_id": "harvest_p", "finish_by": "06:00"}
    assert run_late_alert(**kwargs, context={"dag_run": {"dag_run_id": "m", "run_type": "manual",
                                                         "state": "running"}}) == []
    assert run_late_alert(**kwargs, context={"dag_run": {"dag_run_id": "s0", "run_type": "scheduled",
                                                         "state": "success"}}) == []
    # Unpausing creates the latest tick's run at once, already past its finish_by: not late.
    assert run_late_alert(**kwargs, context={
        "dag_run": {"dag_run_id": "u", "run_type": "scheduled", "state": "queued",
                    "queued_at": "2026-03-02T09:00:00Z"},
        "deadline": {"deadline_time": "2026-03-01T06:00:00+00:00"}}) == []
    assert run_late_alert(**kwargs, context={"dag_run": {"dag_run_id": "s1", "run_type": "scheduled",
                                                         "state": "running"}}) == ["apprise"]
    (body,) = chat.bodies
    assert body["title"] == "[partner harvest] p: harvest_p run s1 not finished by 06:00 UTC"


def test_a_nightly_run_unfinished_at_finish_by_alerts(registry: Callable[[str], Path], chat: WebhookSink, airflow_db: None) -> None:
    """Airflow's own deadline code: creating the scheduled run writes a Deadline at its
    logical date (the 02:00 tick) + 4 h; the scheduler's miss handling queues the callback;
    the executor's callback runner sends the alert."""
    import structlog
    from airflow.dag_processing.dagbag import BundleDagBag, sync_bag_to_db
    from airflow.models import DagRun, Deadline
    from airflow.models.callback import Callback
    from airflow.models.dagbundle import DagBundleModel
    from airflow.models.serialized_dag import SerializedDagModel
    from airflow.sdk.execution_time.callback_supervisor import execute_callback
    from airflow.utils.session import create_session
    from airflow.utils.state import DagRunState
    from airflow.utils.types import DagRunTriggeredByType, DagRunType

    registry("partners:\n  - {id: nightly, protocol: oai-pmh, conn_id: c, schedule: '0 2 * * *', finish_by: '06:00'}\n")
    with create_session() as session:
        if session.get(DagBundleModel, BUNDLE) is None:
            session.add(DagBundleModel(name=BUNDLE))
    bag = BundleDagBag(dag_folder=str(ROOT / "dags" / "partner_harvest.py"), bundle_path=ROOT / "dags",
                       bundle_name=BUNDLE)
    assert "harvest_nightly" in bag.dag_ids and not bag.import_errors
    sync_bag_to_db(bag, BUNDLE, None)

    tick = datetime(2026, 3, 1, 2, tzinfo=timezone.utc)
    with create_session() as session:
        for old in session.query(DagRun).filter(DagRun.dag_id == "harvest_nightly", DagRun.logical_date == tick):
            session.delete(old)  # an earlier session's run of the same night
        session.flush()
        dag = SerializedDagModel.get_dag("harvest_nightly", session=session)
        assert dag is not None
        run = dag.create_dagrun(run_id=f"scheduled__{tick.isoformat()}", logical_date=tick,
                                data_interval=(tick - timedelta(days=1), tick), run_after=tick,
                                run_type=DagRunType.SCHEDULED, triggered_by=DagRunTriggeredByType.TIMETABLE,
                                state=DagRunState.QUEUED, session=session)
        session.flush()
        run.queued_at = tick + timedelta(seconds=5)  # queued on time, as the scheduler does at the tick
        session.flush()
        deadlines = session.query(Deadline).filter(Deadline.dagrun_id == run.id).all()
        (late,) = [d for d in deadlines if d.deadline_time == tick + timedelta(hours=4)]
        assert len(deadlines) == 2  # and the run_deadline, from the logical date
        # 06:00 passes with the run still waiting; what the scheduler loop does then:
        late.handle_miss(session)
        session.flush()
        callback = session.get(Callback, late.callback_id)
        assert callback is not None
        data = dict(callback.data)

    context = data["kwargs"]["context"]  # what the callback reads to tell a late run from a catch-up
    assert _instant(context["deadline"]["deadline_time"]) == tick + timedelta(hours=4)
    assert _instant(context["dag_run"]["queued_at"]) == tick + timedelta(seconds=5)
    ok, error = execute_callback(data["path"], data["kwargs"], Path("partner_harvest.py"), ROOT / "dags",
                                 structlog.get_logger())
    assert (ok, error) == (True, None)
    (body,) = chat.bodies
    assert body["title"] == (f"[partner harvest] nightly: harvest_nightly run scheduled__{tick.isoformat()} "
                             "not finished by 06:00 UTC")
    assert "state: queued" in body["message"] and body["type"] == "failure"
