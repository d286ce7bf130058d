"""A task try reads the aggregation's Connection once (quiet nights).

A Connection kept in the metadata database or a secrets backend costs one request per read;
a quiet night's single task opened seven aggregation connections and so asked seven times.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from partner_harvest.airflow import connections
from partner_harvest.airflow.connections import aggregation_conninfo, read_once_per_task
from partner_harvest.airflow.tasks import _fail_fast


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every read of a Connection, with a password that changes at each read (a rotation)."""
    asked: list[str] = []

    def get_connection(conn_id: str) -> Any:
        asked.append(conn_id)
        return SimpleNamespace(host="db.example", port=5432, login="harvest", password=f"secret{len(asked)}",
                               schema="aggregation", extra_dejson={})

    monkeypatch.setattr(connections.BaseHook, "get_connection", staticmethod(get_connection))
    return asked


def test_a_task_try_reads_the_connection_once(reads: list[str]) -> None:
    @_fail_fast
    def task_body(partner_id: str) -> set[str]:
        return {aggregation_conninfo() for _ in range(7)}

    seen = task_body("p")
    assert reads == ["aggregation_db"]
    assert len(seen) == 1


def test_every_try_reads_it_again(reads: list[str]) -> None:
    with read_once_per_task():
        first = aggregation_conninfo()
    with read_once_per_task():
        second = aggregation_conninfo()
    assert reads == ["aggregation_db", "aggregation_db"]
    assert "secret1" in first and "secret2" in second  # a rotated password reaches the next try


def test_outside_a_task_every_call_reads(reads: list[str]) -> None:
    aggregation_conninfo()
    aggregation_conninfo()
    assert len(reads) == 2


def test_a_nested_block_reuses_the_outer_read_and_other_ids_are_read_apart(reads: list[str]) -> None:
    with read_once_per_task():
        aggregation_conninfo()
        with read_once_per_task():
            aggregation_conninfo()
            aggregation_conninfo("another_db")
        aggregation_conninfo("another_db")
    assert reads == ["aggregation_db", "another_db"]
