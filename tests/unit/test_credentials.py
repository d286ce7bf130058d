"""A partner Connection's credentials (credentials.py) and the OAI-PMH set selection (oai/selection.py)."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
import requests

from partner_harvest.credentials import Credentials, from_connection, redact
from partner_harvest.oai.selection import EXCLUDED, OUTSIDE, Selection, within
from partner_harvest.records import Record, Tombstone

AT = datetime(2026, 1, 1, tzinfo=timezone.utc)


@pytest.mark.parametrize(("login", "password", "extra", "expected"), [
    (None, None, {}, None),
    ("harvester", "pw", {}, ("basic", "harvester", None)),
    ("harvester", "pw", {"auth": "Basic"}, ("basic", "harvester", None)),
    (None, "t0k3n", {"auth": "bearer"}, ("bearer", None, None)),
    (None, "t0k3n", {"auth": "header", "auth_header": "Token"}, ("header", None, "Token")),
    (None, "t0k3n", {"auth": "query", "auth_param": "apikey"}, ("query", None, "apikey")),
])
def test_the_connection_says_how_the_secret_travels(login: str | None, password: str | None, extra: dict[str, str],
                                                    expected: tuple[str, str | None, str | None] | None) -> None:
    found = from_connection(login, password, extra)
    assert (found if found is None else (found.kind, found.login, found.name)) == expected


@pytest.mark.parametrize(("login", "password", "extra", "problem"), [
    (None, "t0k3n", {}, "a password without a login"),
    (None, None, {"auth": "bearer"}, "the Connection's password, which is empty"),
    (None, "t0k3n", {"auth": "header"}, "needs extra 'auth_header'"),
    (None, "t0k3n", {"auth": "header", "auth_header": "Bad Name"}, "not an HTTP header name"),
    (None, "t0k3n", {"auth": "query", "auth_param": "verb"}, "is an OAI-PMH argument"),
    (None, "t0k3n", {"auth": "cookie"}, "must be one of basic, bearer, header, query"),
])
def test_a_connection_that_cannot_work_is_refused_without_its_secret(login: str | None, password: str | None,
                                                                    extra: dict[str, str], problem: str) -> None:
    with pytest.raises(ValueError, match=problem) as refused:
        from_connection(login, password, extra)
    assert "t0k3n" not in str(refused.value)


def test_a_query_credential_is_one_parameter_added_and_taken_off_byte_for_byte() -> None:
    key = Credentials("query", "a+b/c=d", name="apikey")
    request = requests.Request("GET", "https://museum.example/oai?verb=ListRecords&resumptionToken=x%2By+z").prepare()
    key.apply(request)
    key.apply(request)  # a same-origin redirect that echoed it: still one
    assert request.url == "https://museum.example/oai?verb=ListRecords&resumptionToken=x%2By+z&apikey=a%2Bb%2Fc%3Dd"
    assert key.withhold(request) and request.url == "https://museum.example/oai?verb=ListRecords&resumptionToken=x%2By+z"
    assert redact("GET /oai?apikey=a%2Bb%2Fc%3Dd and a+b/c=d") == "GET /oai?apikey=*** and ***"


def test_selection_by_sets_exclusions_and_the_set_hierarchy() -> None:
    assert within("type:dataset:raw", "type") and within("type", "type") and not within("typeface", "type")
    selection = Selection(("type:painting", "dept"), ("dept:asian-art",))
    record = Record("r1", AT, "oai_dc", "<x/>", ("type:print", "dept:asian-art:china"))
    assert selection.judge(record) == Tombstone("r1", AT, EXCLUDED)
    assert selection.judge(Record("r2", AT, "oai_dc", "<x/>", ("type:print",))) .identifier == "r2"
    assert selection.leaver(("type:print",), False) == (True, OUTSIDE)
    assert selection.leaver(("dept:prints",), False) == (False, None)  # below dept, allowed
    assert selection.leaver((), False) == (False, None)  # a header without setSpecs says nothing
    assert selection.leaver(("type:painting",), True) == (True, None)  # a deletion notice
    assert Selection().lists == (None,) and not Selection().sweeps_leavers
