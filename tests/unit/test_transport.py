"""Retry-After handling: seconds and HTTP-dates, capped."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from email.utils import format_datetime
from pathlib import Path

import pytest
from requests.adapters import HTTPAdapter
from urllib3.response import HTTPResponse
from urllib3.util.retry import Retry

from partner_harvest.transport import CappedRetry, HttpPolicy, PartnerAdapter, ServerAsksToWait, Transport, build_session, origin, widen


def retry_of(policy: HttpPolicy) -> Retry:
    adapter = build_session("p", policy).get_adapter("http://x")
    assert isinstance(adapter, HTTPAdapter)
    return adapter.max_retries


def test_retry_after_seconds_and_cap() -> None:
    retry = retry_of(HttpPolicy(retry_after_cap=30))
    assert retry.parse_retry_after("7") == 7
    assert retry.parse_retry_after("86400") == 30


def test_retry_after_http_date_is_capped() -> None:
    retry = retry_of(HttpPolicy(retry_after_cap=60))
    in_a_day = format_datetime(datetime.now(timezone.utc) + timedelta(days=1), usegmt=True)
    assert retry.parse_retry_after(in_a_day) == 60
    past = format_datetime(datetime(2001, 1, 1, tzinfo=timezone.utc), usegmt=True)
    assert retry.parse_retry_after(past) == 0


def test_session_defaults() -> None:
    session = build_session("p", HttpPolicy(connect_timeout=3, read_timeout=9, retries=4))
    assert session.default_timeout == (3, 9)
    assert "gzip" in session.headers["Accept-Encoding"]
    adapter = session.get_adapter("https://x")
    assert isinstance(adapter, HTTPAdapter) and isinstance(adapter.max_retries, CappedRetry)
    retry = adapter.max_retries
    assert retry.total == 4 and 503 in retry.status_forcelist and 429 in retry.status_forcelist
    assert retry.respect_retry_after_header and retry.new().retry_after_cap == retry.retry_after_cap
    assert session.verify is True and session.cert is None and session.proxies == {}


def test_limit_defaults() -> None:
    policy = HttpPolicy()
    assert policy.max_response_bytes == 64 * 1024 * 1024
    assert policy.request_deadline == 600 and policy.max_xml_nodes == 2_000_000


def test_a_retry_after_longer_than_a_task_may_sleep_is_not_slept() -> None:
    retry = retry_of(HttpPolicy(max_wait_in_task=60, retry_after_cap=300, backoff_factor=0)).new()
    with pytest.raises(ServerAsksToWait) as asked:
        retry.sleep(HTTPResponse(status=503, headers={"Retry-After": "3600"}))
    assert (asked.value.seconds, asked.value.status) == (300, 503)  # capped, then handed back
    retry.sleep(HTTPResponse(status=503, headers={"Retry-After": "0"}))  # within the limit: slept
    assert HttpPolicy().max_wait_in_task == 60


@pytest.mark.parametrize("field,value", [("max_response_bytes", 0), ("max_response_bytes", True),
                                         ("request_deadline", 0), ("max_xml_nodes", 1.5),
                                         ("max_wait_in_task", -1), ("max_wait_in_task", "1")])
def test_bad_limits_are_refused(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=f"options.http\n{field}\n"):  # pydantic: the model's title, the field
        HttpPolicy(**{field: value})


@pytest.mark.parametrize("old,new,strip", [
    ("https://p.example/oai", "https://p.example/other?x=1", False),
    ("https://p.example/oai", "https://p.example:443/oai", False),
    ("https://p.example/oai", "http://p.example/oai", True),  # downgrade
    ("http://p.example/oai", "https://p.example/oai", True),  # requests keeps auth here; we do not
    ("https://p.example/oai", "https://p.example:8443/oai", True),
    ("https://p.example/oai", "https://cdn.p.example/oai", True),
    ("https://P.EXAMPLE/oai", "https://p.example/oai", False),
])
def test_credentials_only_follow_a_redirect_within_the_origin(old: str, new: str, strip: bool) -> None:
    assert build_session("p").should_strip_auth(old, new) is strip


def test_origin_fills_in_default_ports() -> None:
    assert origin("https://Partner.Example/iii/sierra-api/v6") == ("https", "partner.example", 443)
    assert origin("http://127.0.0.1:8080/oai") == ("http", "127.0.0.1", 8080)


def test_transport_from_connection_extras(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("-")
    assert Transport.from_extra(None) == Transport()
    assert Transport.from_extra({"verify": "true", "unrelated": 1}).verify is True
    transport = Transport.from_extra({"verify": str(ca), "cert": [str(ca), str(ca)],
                                      "proxies": {"https": "http://u:secret@proxy:3128"}})
    assert transport.verify == str(ca) and transport.cert == (str(ca), str(ca))
    assert "secret" not in repr(transport)


@pytest.mark.parametrize("verify", [False, "false", "False", 0, None, ""])
def test_switching_tls_verification_off_is_refused(verify: object) -> None:
    with pytest.raises(ValueError, match="refused"):
        Transport.from_extra({"verify": verify})


def test_widen_keeps_a_pool_that_is_wide_enough_and_never_narrows_it() -> None:
    """Each caller asks for what it sends at once (a plan's probes, the settle's GetRecords);
    a pool already that wide keeps its adapter, and with it its open connections."""
    session = build_session("p")
    widen(session, 2)  # the session's own width: nothing to do
    narrow = session.get_adapter("http://x")
    widen(session, 5)
    wide = session.get_adapter("http://x")
    assert isinstance(wide, PartnerAdapter) and wide is not narrow
    widen(session, 4)
    widen(session, 5)
    kept = session.get_adapter("http://x")
    assert kept is wide and kept.poolmanager.connection_pool_kw["maxsize"] == 5
