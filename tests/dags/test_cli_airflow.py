"""`partner-harvest` against Airflow's REST API (the api-server's app in this process, a real
metadata DB): pools, cursor Variables; the Connection aggregation_db from the environment;
a real PostgreSQL aggregation."""

from __future__ import annotations

import io
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from airflow.models.pool import Pool

from partner_harvest.airflow import admin
from partner_harvest.cli import main
from partner_harvest.registry import cursor_key
from partner_harvest.store import connect, ensure_schema
from partner_harvest.store.db import scalar

pytestmark = pytest.mark.airflow


@pytest.fixture
def ids(airflow_api: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Fresh partner ids (the metadata DB is shared by the session); their pools and
    Variables are removed afterwards. The aggregation comes from the Connection only."""
    monkeypatch.delenv("HARVEST_DATABASE_URL", raising=False)
    made = [f"cli{uuid.uuid4().hex[:8]}" for _ in range(2)]
    yield made
    for pid in made:
        admin.delete_pool(f"partner_{pid}")
        for channel in (None, "deletions"):
            admin.delete_variable(cursor_key(pid, channel))


def entry(pid: str, protocol: str = "oai-pmh", slots: int = 1) -> str:
    return f"\n  - id: {pid}\n    protocol: {protocol}\n    conn_id: partner_{pid}\n    pool_slots: {slots}\n"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def test_sync_pools_creates_what_check_reports_missing(capsys: pytest.CaptureFixture[str], ids: list[str],
                                                       registry: Callable[[str], Path]) -> None:
    oai, sierra = ids
    registry("partners:" + entry(oai) + entry(sierra, "sierra", slots=3))
    status, _, err = run(capsys, "sync-pools", "--check")
    assert status == 1 and f"pool partner_{oai} is missing" in err and f"pool partner_{sierra} is missing" in err
    status, out, _ = run(capsys, "sync-pools")
    assert status == 0 and f"pool partner_{sierra}: 3 slot(s)" in out
    assert getattr(Pool.get_pool(f"partner_{sierra}"), "slots", None) == 3
    assert run(capsys, "sync-pools", "--check")[0] == 0


def test_reset_cursor_sets_or_deletes_every_cursor_of_a_sierra_partner(capsys: pytest.CaptureFixture[str], ids: list[str],
                                                                       registry: Callable[[str], Path], aggregation_conn: str,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    pid = ids[0]
    registry("partners:" + entry(pid, "sierra"))
    with connect(aggregation_conn) as conn:  # the aggregation database, found through aggregation_db
        ensure_schema(conn)
    for channel, until in ((None, "2026-06-01T10:00:00Z"), ("deletions", "2026-06-01T00:00:00Z")):
        admin.write_variable(cursor_key(pid, channel), {"until": until, "granularity": "day" if channel else "seconds"}, "t")

    status, out, _ = run(capsys, "reset-cursor", pid, "--to", "2026-05-02T13:14:15Z", "--yes")
    assert status == 0, out
    cursors = [admin.read_variable(cursor_key(pid, channel)) or {} for channel in (None, "deletions")]
    assert [c.get("until") for c in cursors] == ["2026-05-02T13:14:15Z", "2026-05-02T00:00:00Z"]  # deletions: by day
    assert "the next run starts from there" in out  # nothing applied in this aggregation yet

    monkeypatch.setattr("sys.stdin", io.StringIO("\n"))  # declined
    assert run(capsys, "reset-cursor", pid)[0] == 1
    assert admin.read_variable(cursor_key(pid)) is not None

    status, out, _ = run(capsys, "reset-cursor", pid, "--channel", "changes", "--yes")
    assert status == 0 and "harvests everything" in out
    assert admin.read_variable(cursor_key(pid)) is None
    assert admin.read_variable(cursor_key(pid, "deletions")) is not None


def test_reset_cursor_of_an_unknown_partner_changes_nothing(capsys: pytest.CaptureFixture[str], ids: list[str],
                                                            registry: Callable[[str], Path]) -> None:
    registry("partners:" + entry(ids[0]))
    status, _, err = run(capsys, "reset-cursor", ids[1], "--yes")
    assert status == 1 and f"no partner '{ids[1]}'" in err


def test_forget_removes_rows_variables_and_the_pool_of_a_retired_partner(capsys: pytest.CaptureFixture[str], ids: list[str],
                                                                         registry: Callable[[str], Path], aggregation_conn: str) -> None:
    retired, kept = ids
    registry("partners:" + entry(kept))
    assert run(capsys, "sync-pools")[0] == 0
    Pool.create_or_update_pool(f"partner_{retired}", 1, "retired", include_deferred=False)
    for pid in ids:
        admin.write_variable(cursor_key(pid), {"until": "2026-06-01T10:00:00Z"}, "t")
    with connect(aggregation_conn) as conn:
        ensure_schema(conn)
        for pid in ids:
            conn.execute("INSERT INTO records (partner_id, identifier, datestamp, metadata_prefix, metadata,"
                         " content_hash, run_id) VALUES (%s, 'x', now(), 'oai_dc', '<x/>', 'h', 'r')", (pid,))
        conn.commit()

    status, out, _ = run(capsys, "forget", retired, "--yes")
    assert status == 0, out
    assert admin.read_variable(cursor_key(retired)) is None and Pool.get_pool(f"partner_{retired}") is None
    status, out, _ = run(capsys, "forget", kept, "--yes")  # still in the registry: its pool stays
    assert status == 0 and "kept" in out
    assert admin.read_variable(cursor_key(kept)) is None and Pool.get_pool(f"partner_{kept}") is not None
    with connect(aggregation_conn) as conn:
        assert scalar(conn.execute("SELECT count(*) FROM records WHERE partner_id = ANY(%s)", (ids,))) == 0
