"""Retry-After handling: seconds and HTTP-dates, capped."""

from __future__ import annotations

from email.utils import format_datetime
from datetime import datetime, timedelta, timezone

from partner_harvest.http import HttpPolicy, build_session


def retry_of(policy: HttpPolicy):
    session = build_session("p", policy)
    return session.get_adapter("http://x").max_retries


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
    retry = session.get_adapter("https://x").max_retries
    assert retry.total == 4 and 503 in retry.status_forcelist and 429 in retry.status_forcelist
    assert retry.respect_retry_after_header and retry.new().retry_after_cap == retry.retry_after_cap
