"""The health index pages, sorts and filters on the server: 230 partners
against a real PostgreSQL, rendered by the app itself (Airflow's login: test_health.py)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

import psycopg
import pytest

from tests.support import fleet

if TYPE_CHECKING:
    from fastapi.testclient import TestClient

N = 230


@pytest.fixture
def client(conn: psycopg.Connection, db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> TestClient:
    from fastapi.testclient import TestClient

    app = fleet.serve_health_app(conn, db, tmp_path, N, monkeypatch)
    return TestClient(app)


def text(page: str) -> str:
    return " ".join(page.split())


def ids(page: str) -> list[str]:
    return re.findall(r'<tr data-partner="([^"]+)"', page)


def states(page: str) -> list[str]:
    return re.findall(r'<tr data-partner="[^"]+" data-state="([^"]+)"', page)


def test_the_index_sends_one_page_worst_first_with_links_to_the_others(client: TestClient) -> None:
    page = client.get("/").text
    assert len(ids(page)) == 50
    assert states(page)[:23] == ["failing"] * 23 and "failing" not in states(page)[23:]  # worst first
    assert ids(page)[:3] == ["p00010", "p00020", "p00030"]
    assert "1–50 of 230 · page 1 of 5" in text(page)
    assert 'href="?page=2" class="next"' in page and 'href="?page=5" class="last"' in page
    last = client.get("/?page=5").text
    assert len(ids(last)) == 30 and "201–230 of 230" in text(last) and 'class="next"' not in last
    assert ids(client.get("/?page=99").text) == ids(last)  # past the end: the last page
    every = [i for p in range(1, 6) for i in ids(client.get(f"/?page={p}").text)]
    assert sorted(every) == [fleet.partner_id(i) for i in range(1, N + 1)]  # each partner once


def test_the_index_filters_by_state_protocol_and_text_and_sorts_by_name_and_lag(client: TestClient) -> None:
    failing = client.get("/?state=failing&per_page=100").text
    assert ids(failing) == [fleet.partner_id(i) for i in range(10, N + 1, 10)]
    assert "1–23 of 23 matching" in text(failing)
    sierra = client.get("/?protocol=sierra&per_page=100").text
    assert sorted(ids(sierra)) == [fleet.partner_id(i) for i in range(5, N + 1, 5)]
    outage = client.get("/?q=refused+by+shared-host&per_page=100").text  # a cause finds a shared outage
    assert sorted(ids(outage)) == [fleet.partner_id(i) for i in range(10, N + 1, 10)]
    assert sorted(ids(client.get("/?q=P0012").text)) == [fleet.partner_id(i) for i in range(120, 130)]
    by_name = client.get("/?sort=name&order=desc").text
    assert ids(by_name)[:2] == ["p00230", "p00229"]
    assert '<a href="?sort=name" class="sort sort-name">' in by_name  # a second click reverses
    by_lag = ids(client.get("/?sort=lag&order=desc&state=ok&per_page=500").text)
    lags = [int(p[1:]) % 97 for p in by_lag]
    assert lags == sorted(lags, reverse=True)
    assert ids(client.get("/?sort=bogus&page=x&per_page=-3").text)[:1] == ["p00010"]  # nonsense: the defaults
