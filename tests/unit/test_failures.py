"""A failed try's verdict (partner_harvest/failures.py): a short cause first, the full text
kept whole, and whether a retry may help; the task wrapper fails what no retry can fix at once.

Real exceptions, not hand-made strings: a request to a closed port on loopback, the Task SDK's
own error for an undefined Connection, a certificate error as requests raises it.
"""

from __future__ import annotations

import re
import socket
import ssl
from datetime import timedelta

import pytest
import requests

from partner_harvest import failures
from partner_harvest.errors import ConfigurationError, HarvestLoopError, PartnerHttpError
from partner_harvest.transport import HttpPolicy, build_session, partner_request


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_a_refused_connection_reads_connection_refused_at_host_port_and_is_retried() -> None:
    """The index and `status` showed urllib3's repr cut mid-word just before "Connection refused"."""
    port = closed_port()
    session = build_session("p", HttpPolicy(retries=0))
    with pytest.raises(PartnerHttpError) as caught, partner_request("p", f"GET http://127.0.0.1:{port}/oai"):
        session.get(f"http://127.0.0.1:{port}/oai", params={"verb": "Identify"})
    failure = failures.classify(caught.value)
    assert failure.short == f"connection refused at 127.0.0.1:{port}"
    assert failure.retry and failure.rule == "connection refused"
    assert "[Errno 111] Connection refused" in failure.full and failure.full.startswith("partner 'p': ")


def test_an_undefined_connection_is_named_and_not_retried() -> None:
    from airflow.sdk.exceptions import AirflowNotFoundException

    failure = failures.classify(AirflowNotFoundException("The conn_id `partner_gone` isn't defined"))
    assert (failure.short, failure.retry) == ("Connection 'partner_gone' is not defined", False)


@pytest.mark.parametrize(("cause", "short", "retry"), [
    ("HTTP 503 Service Unavailable: down for maintenance", "HTTP 503 from museum.example", True),
    ("HTTP 429 Too Many Requests: slow down", "HTTP 429 from museum.example", True),
    ("HTTP 401 Unauthorized: who are you", "HTTP 401 from museum.example: credentials refused", False),
    ("HTTP 403 Forbidden: no", "HTTP 403 from museum.example: credentials refused", False),
    ("HTTP 404 Not Found: <html>", "HTTP 404 from museum.example: the request is refused as sent "
     "(wrong URL or parameters?)", False),
])
def test_http_statuses(cause: str, short: str, retry: bool) -> None:
    failure = failures.classify(PartnerHttpError("p", "GET https://museum.example/oai?verb=Identify", cause))
    assert (failure.short, failure.retry) == (short, retry)


def test_a_certificate_error_is_not_retried() -> None:
    verify = ssl.SSLCertVerificationError(1, "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: "
                                             "self-signed certificate (_ssl.c:1006)")
    try:
        try:
            raise requests.exceptions.SSLError(verify)
        except requests.RequestException as exc:
            raise PartnerHttpError("p", "GET https://museum.example/oai", f"SSLError: {exc}") from exc
    except PartnerHttpError as error:
        failure = failures.classify(error)
    assert failure.short == "certificate error at museum.example:443: self-signed certificate"
    assert not failure.retry


def test_configuration_and_loops_are_not_retried_and_other_errors_are() -> None:
    wrong = failures.classify(ConfigurationError("p", "Connection 'partner_p'", "is of type 'postgres'"))
    assert (wrong.short, wrong.retry) == ("Connection 'partner_p': is of type 'postgres'", False)
    loop = failures.classify(HarvestLoopError("p", "ListRecords", "the partner returned the token abc a second time"))
    assert (loop.short, loop.retry) == ("the partner returned the token abc a second time", False)
    token = failures.classify(PartnerHttpError("p", "ListRecords", "resumptionToken expired 4 times (x); gave up"))
    assert (token.short, token.retry) == ("token expired (4 restarts)", True)
    other = failures.classify(RuntimeError("something odd"))
    assert (other.short, other.retry, other.rule) == ("something odd", True, "other")


def test_the_short_cause_is_cut_at_a_word_never_mid_word() -> None:
    text = "word " * 60
    short = failures.shorten(text, 50)
    assert len(short) <= 50 and short.endswith("word…") and re.fullmatch(r"(word )*word…", short)


def test_the_retry_waits_are_airflows_exponential_backoff() -> None:
    """Airflow 3: delay * 2 ** (try - 1), then a point below twice that, capped by max_retry_delay."""
    waits = [failures.retry_wait(timedelta(minutes=2), 2.0, timedelta(minutes=30), n) for n in (1, 2, 3, 5)]
    assert waits == [(timedelta(seconds=120), timedelta(seconds=239)), (timedelta(seconds=240), timedelta(seconds=479)),
                     (timedelta(seconds=480), timedelta(seconds=959)), (timedelta(minutes=30), timedelta(minutes=30))]
    assert failures.retry_wait(timedelta(minutes=5), 1.0, None, 3) == (timedelta(minutes=5), timedelta(minutes=5))
    assert failures.transport_wait(5, 2.0, 120.0) == 0 + 4 + 8 + 16 + 32
