"""Fast, honest failure: the task wrapper fails a try at once (AirflowFailException, no Airflow
retry) when no retry can fix its error, and leaves the rest to Airflow's retries; a failed try
that will be retried alerts at once ("retrying, attempt n of m, next try in ..."), the final
failure says it was the last or that no retry could fix it. Without a running Airflow: the
wrapper and the notifier are called as Airflow calls them, with the Task SDK's own exceptions.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, cast

import pytest
from airflow.sdk.exceptions import AirflowFailException, AirflowNotFoundException

from partner_harvest.airflow import notifiers, tasks
from partner_harvest.errors import PartnerHttpError

if TYPE_CHECKING:
    from airflow.sdk.definitions.context import Context

REFUSED = PartnerHttpError(
    "museum", "GET http://127.0.0.1:9/oai?verb=Identify",
    "ConnectionError: HTTPConnectionPool(host='127.0.0.1', port=9): Max retries exceeded with url: "
    "/oai?verb=Identify (Caused by NewConnectionError(\"HTTPConnection(host='127.0.0.1', port=9): Failed to "
    "establish a new connection: [Errno 111] Connection refused\"))")


def test_an_undefined_connection_fails_the_try_at_once() -> None:
    """It was retried three times, 17 minutes, before anyone heard of it."""
    @tasks._fail_fast
    def freeze(partner_id: str) -> None:
        raise AirflowNotFoundException("The conn_id `partner_museum` isn't defined")

    with pytest.raises(AirflowFailException) as caught:
        freeze("museum")
    assert isinstance(caught.value.__cause__, AirflowNotFoundException)


def test_an_outage_is_left_to_airflows_retries() -> None:
    @tasks._fail_fast
    def freeze(partner_id: str) -> None:
        raise REFUSED

    with pytest.raises(PartnerHttpError):
        freeze("museum")


def context(exception: BaseException, try_number: int = 1, max_tries: int = 3) -> Context:
    task = SimpleNamespace(retry_delay=timedelta(minutes=2), retry_exponential_backoff=2.0,
                           max_retry_delay=timedelta(minutes=30))
    ti = SimpleNamespace(dag_id="harvest_museum", task_id="freeze_window", try_number=try_number, max_tries=max_tries,
                         run_id="manual__1", log_url="http://airflow.example/log", task=task,
                         xcom_pull=lambda **kw: None)
    return cast("Context", {"ti": ti, "exception": exception, "dag_run": SimpleNamespace(run_id="manual__1")})


Sent = list[tuple[str, list[str], dict[str, Any]]]  # the alerts sent: subject, lines, fields


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> Sent:
    alerts: Sent = []
    monkeypatch.setenv("HARVEST_ALERT_DIGEST_MINUTES", "0")  # no folding: the alert itself

    def send_alert(subject: str, lines: list[str], fields: dict[str, Any], *rest: object) -> list[str]:
        alerts.append((subject, lines, fields))
        return ["test"]

    monkeypatch.setattr(notifiers, "send_alert", send_alert)
    return alerts


def test_a_failed_try_that_will_be_retried_alerts_at_once(sent: Sent) -> None:
    notifiers.PartnerAlertNotifier("museum", retrying=True).notify(context(REFUSED))
    ((subject, lines, fields),) = sent
    assert subject == ("[partner harvest] museum: harvest_museum.freeze_window retrying: connection refused at "
                       "127.0.0.1:9 (attempt 1 of 4 failed)")
    verdict = next(line for line in lines if line.startswith("Retrying: "))
    assert verdict.startswith("Retrying: attempt 1 of 4 failed; next try in 2m–3m 59s (by ")
    assert "Cause: connection refused at 127.0.0.1:9" in lines
    assert any(line.startswith("Details: ") and line.endswith("(request: GET http://127.0.0.1:9/oai?verb=Identify)")
               for line in lines)
    assert fields["kind"] == "retrying" and fields["attempts"] == 4


def test_the_final_failure_says_it_was_the_last_try_or_that_no_retry_could_fix_it(sent: Sent) -> None:
    notifiers.PartnerAlertNotifier("museum").notify(context(REFUSED, try_number=4))
    failed_at_once = AirflowFailException("The conn_id `partner_museum` isn't defined")
    failed_at_once.__cause__ = AirflowNotFoundException("The conn_id `partner_museum` isn't defined")
    notifiers.PartnerAlertNotifier("museum").notify(context(failed_at_once))
    (last, _, _), (at_once, lines, _) = sent
    assert last == "[partner harvest] museum: harvest_museum.freeze_window failed: connection refused at 127.0.0.1:9"
    assert at_once == ("[partner harvest] museum: harvest_museum.freeze_window failed: Connection 'partner_museum' "
                       "is not defined")
    assert ("Failed at once on attempt 1 of 4: no retry can fix this (Connection not defined). Fix the cause, then "
            "clear the task.") in lines


def test_the_next_try_is_airflows_window() -> None:
    now = datetime(2026, 1, 1, 2, 0, tzinfo=timezone.utc)
    assert notifiers.next_try(context(REFUSED, try_number=2), now) == "next try in 4m–7m 59s (by 02:07Z)"
