"""`partner-harvest` against a real PostgreSQL: validate, migrate, status, forget.

The commands run in-process through ``cli.main`` (what the console script calls); the
Airflow side (Variables, pools, the Connection) is in tests/dags/test_cli_airflow.py.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path

import psycopg
import pytest

from partner_harvest.cli import main
from partner_harvest.store import connect, ensure_schema
from partner_harvest.store.db import scalar
from partner_harvest.store.schema import SchemaNotReady, migration_files
from tests.support.records import seed_sliced_run

GOOD = """
  - id: museum
    protocol: oai-pmh
    conn_id: partner_museum
"""
REGISTRY_WITH_ERRORS = "partners:" + GOOD + """
  - id: bad_lag
    protocol: oai-pmh
    conn_id: partner_bad_lag
    lag: soon
  - id: bad_protocol
    protocol: gopher
    conn_id: partner_bad_protocol
  - id: twice
    protocol: oai-pmh
    conn_id: partner_twice
  - id: twice
    protocol: sierra
    conn_id: partner_twice
"""


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


@pytest.fixture
def registry_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[str], Path]:
    def write(body: str) -> Path:
        path = tmp_path / "partners.yaml"
        path.write_text(body, encoding="utf-8")
        monkeypatch.setenv("HARVEST_PARTNERS_FILE", str(path))
        return path

    return write


def seed(conn: psycopg.Connection, partner_id: str, records: int, *, status: str = "applied",
         applied_at: datetime | None = None, error: str | None = None) -> None:
    applied_at = applied_at or datetime.now(timezone.utc)
    with conn.transaction():
        conn.execute(
            "INSERT INTO harvest_runs (partner_id, run_id, channel, mode, status, error, started_at, applied_at)"
            " VALUES (%s, %s, 'changes', 'incremental', %s, %s, %s, %s)",
            (partner_id, f"harvest_{partner_id}/r1", status, error, applied_at - timedelta(minutes=5),
             applied_at if status == "applied" else None),
        )
        for n in range(records):
            conn.execute(
                "INSERT INTO records (partner_id, identifier, datestamp, metadata_prefix, metadata, content_hash, run_id)"
                " VALUES (%s, %s, now(), 'oai_dc', '<x/>', 'h', 'r1')",
                (partner_id, f"oai:{partner_id}:{n}"),
            )
        conn.execute(
            "INSERT INTO quarantine (partner_id, identifier, reason, raw_payload, run_id)"
            " VALUES (%s, 'oai:broken', 'no title', '<record/>', 'r1')", (partner_id,),
        )
        conn.execute(  # the counters the apply keeps (these rows bypass the apply)
            "INSERT INTO partner_stats (partner_id, records_held, quarantined_now) VALUES (%s, %s, 1)"
            " ON CONFLICT (partner_id) DO UPDATE SET records_held = EXCLUDED.records_held",
            (partner_id, records),
        )


def count(conn: psycopg.Connection, table: str, partner_id: str) -> int:
    return scalar(conn.execute(f"SELECT count(*) FROM {table} WHERE partner_id = %s", (partner_id,)))


# -- validate -----------------------------------------------------------------------------

def test_validate_exits_nonzero_listing_every_invalid_entry(capsys: pytest.CaptureFixture[str],
                                                            registry_file: Callable[[str], Path]) -> None:
    path = registry_file(REGISTRY_WITH_ERRORS)
    status, out, err = run(capsys, "validate")
    assert status == 1
    assert "ok       museum (oai-pmh" in out
    invalid = [line for line in out.splitlines() if line.startswith("INVALID")]
    assert len(invalid) == 3, out
    assert any("partner 'bad_lag', field 'lag'" in line for line in invalid)
    assert any("partner 'bad_protocol', field 'protocol'" in line for line in invalid)
    assert any("partner 'twice', field 'id': duplicate partner id" in line for line in invalid)
    assert all(str(path) in line for line in invalid)
    assert "3 invalid entries" in err


def test_validate_passes_on_the_project_registry(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HARVEST_PARTNERS_FILE", raising=False)
    status, out, _ = run(capsys, "validate")
    assert status == 0, out
    assert "all valid" in out


def test_validate_of_an_unreadable_file_names_it(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.yaml"
    status, _, err = run(capsys, "validate", "--registry", str(missing))
    assert status == 1
    assert str(missing) in err and "file not found" in err


# -- migrate and HARVEST_SCHEMA_MANAGED=external -----------------------------------------

def test_migrate_applies_every_migration_once(capsys: pytest.CaptureFixture[str], db: str) -> None:
    names = [name for name, _ in migration_files()]
    status, out, _ = run(capsys, "migrate", "--check", "--database-url", db)
    assert status == 1 and [line.split()[-1] for line in out.splitlines()] == names
    status, out, _ = run(capsys, "migrate", "--database-url", db)
    assert status == 0 and [line.split()[-1] for line in out.splitlines()] == names
    status, out, _ = run(capsys, "migrate", "--check", "--database-url", db)
    assert status == 0 and "up to date" in out


def test_externally_managed_schema_runs_no_ddl_in_tasks(capsys: pytest.CaptureFixture[str], db: str,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HARVEST_SCHEMA_MANAGED", "external")
    with connect(db) as conn:
        with pytest.raises(SchemaNotReady, match="0001_initial.sql.*partner-harvest migrate"):
            ensure_schema(conn)
        assert scalar(conn.execute("SELECT to_regclass('schema_migrations')")) is None  # nothing created
        conn.rollback()
    assert run(capsys, "migrate", "--database-url", db)[0] == 0  # the tool still migrates
    with connect(db) as conn:
        assert ensure_schema(conn) == []
        conn.execute("DELETE FROM schema_migrations WHERE name = %s", (migration_files()[-1][0],))
        conn.commit()
        with pytest.raises(SchemaNotReady, match=migration_files()[-1][0]):
            ensure_schema(conn)


# -- status -------------------------------------------------------------------------------

def test_status_shows_one_line_per_partner(capsys: pytest.CaptureFixture[str], conn: psycopg.Connection, db: str,
                                           registry_file: Callable[[str], Path]) -> None:
    registry_file("partners:" + GOOD + """
  - id: archive
    protocol: oai-pmh
    conn_id: partner_archive
  - id: library
    protocol: sierra
    conn_id: partner_library
""")
    seed(conn, "museum", 3)
    seed(conn, "archive", 1, status="failed", error="HTTP 503 from https://archive.example/oai\nTraceback...")
    status, out, _ = run(capsys, "status", "--database-url", db)
    assert status == 0
    lines = {line.split()[0]: line for line in out.splitlines()[2:5]}
    assert set(lines) == {"archive", "library", "museum"}
    assert lines["museum"].split()[:5] == ["museum", "oai-pmh", "ok", "3", "1"]
    assert "failing" in lines["archive"] and "HTTP 503 from https://archive.example/oai" in lines["archive"]
    assert "archive failing: changes: HTTP 503 from https://archive.example/oai" in out.splitlines()
    assert "Traceback" not in out
    assert lines["library"].split()[2:4] == ["never", "run"]


def test_status_of_a_partner_that_went_quiet(capsys: pytest.CaptureFixture[str], conn: psycopg.Connection, db: str,
                                             registry_file: Callable[[str], Path]) -> None:
    registry_file("partners:" + GOOD + "    quiet_period: 2d\n")
    seed(conn, "museum", 1, applied_at=datetime.now(timezone.utc) - timedelta(days=3))
    status, out, _ = run(capsys, "status", "--database-url", db, "--partner", "museum")
    line = out.splitlines()[2]
    assert status == 0 and " quiet " in line and "no record fetched for 3 days" in line


def test_status_of_a_database_without_the_schema_says_to_migrate(capsys: pytest.CaptureFixture[str], db: str,
                                                                 registry_file: Callable[[str], Path]) -> None:
    registry_file("partners:" + GOOD)
    status, _, err = run(capsys, "status", "--database-url", db)
    assert status == 1 and "partner-harvest migrate" in err


# -- forget -------------------------------------------------------------------------------

def test_forget_removes_only_that_partners_rows_after_confirmation(capsys: pytest.CaptureFixture[str], conn: psycopg.Connection, db: str,
                                                                   registry_file: Callable[[str], Path],
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    registry_file("partners:" + GOOD)
    seed(conn, "gone", 4)
    seed(conn, "museum", 2)
    monkeypatch.setattr("sys.stdin", io.StringIO("museum\n"))  # the wrong id: declined
    status, out, _ = run(capsys, "forget", "gone", "--database-only", "--database-url", db)
    assert status == 1 and "records 4" in out and "nothing changed" in out
    assert count(conn, "records", "gone") == 4
    monkeypatch.setattr("sys.stdin", io.StringIO("gone\n"))
    status, out, _ = run(capsys, "forget", "gone", "--database-only", "--database-url", db)
    assert status == 0, out
    assert "deletions written to the change feed: 4 (reason 'forgotten')" in out
    assert [count(conn, t, "gone") for t in ("records", "harvest_runs", "quarantine")] == [0, 0, 0]
    assert [count(conn, t, "museum") for t in ("records", "harvest_runs", "quarantine")] == [2, 1, 1]


def test_forget_refuses_a_partner_whose_run_holds_the_lease(capsys: pytest.CaptureFixture[str], conn: psycopg.Connection, db: str) -> None:
    seed(conn, "busy", 2)
    conn.execute("INSERT INTO partner_leases (partner_id, holder, kind, expires_at)"
                 " VALUES ('busy', 'harvest_busy/scheduled__x', 'harvest', now() + interval '5 minutes')")
    conn.commit()
    status, _, err = run(capsys, "forget", "busy", "--yes", "--database-only", "--database-url", db)
    assert status == 1 and "harvest_busy/scheduled__x" in err and "busy" in err
    assert count(conn, "records", "busy") == 2


def test_forget_rejects_an_id_that_is_not_a_slug(capsys: pytest.CaptureFixture[str], db: str) -> None:
    status, _, err = run(capsys, "forget", "a__b", "--yes", "--database-only", "--database-url", db)
    assert status == 1 and "a__b" in err


# -- progress -----------------------------------------------------------------------------

def test_progress_shows_each_slice_with_its_rate_and_the_time_left(capsys: pytest.CaptureFixture[str], conn: psycopg.Connection, db: str,
                                                                   registry_file: Callable[[str], Path]) -> None:
    registry_file("partners:" + GOOD)
    ensure_schema(conn)
    seed_sliced_run(conn, "museum", "harvest_museum/older")
    conn.execute("UPDATE harvest_runs SET started_at = started_at - interval '1 day' WHERE run_id = 'harvest_museum/older'")
    conn.commit()
    seed_sliced_run(conn, "museum", "harvest_museum/newest")
    status, out, _ = run(capsys, "progress", "museum", "--database-url", db)
    assert status == 0
    lines = {line.split()[0]: line for line in out.splitlines()[2:] if line.startswith("changes")}
    assert set(lines) == {"changes/001", "changes/002", "changes/003"}  # the parent row is left out
    running = lines["changes/002"].split()
    assert running[1:5] == ["harvesting", "set", "dept:prints", "2021-01-01T00:00:01Z..2026-01-01T00:00:00Z"]
    assert running[5:9] == ["4", "2000", "10000", "20%"]
    assert running[9] == "21" and running[10:12] == ["6m", "28s"]  # 2,000 in 97 s; 8,000 to go at that rate
    assert "s ago" in lines["changes/002"] and lines["changes/003"].split()[1] == "planned"
    summary = out.splitlines()[-1]
    assert summary.startswith("run harvest_museum/newest: 12,000 of 26,000 records, 21/s now, time left 11m 19s")  # 14,000 to go


def test_progress_of_a_partner_without_runs_says_so(capsys: pytest.CaptureFixture[str], conn: psycopg.Connection, db: str,
                                                    registry_file: Callable[[str], Path]) -> None:
    registry_file("partners:" + GOOD)
    ensure_schema(conn)
    status, _, err = run(capsys, "progress", "museum", "--database-url", db)
    assert status == 1 and "partner museum has no run" in err


def test_progress_of_a_partner_not_in_the_registry_says_so(capsys: pytest.CaptureFixture[str], conn: psycopg.Connection, db: str,
                                                           registry_file: Callable[[str], Path]) -> None:
    """Regression: `progress nosuch` said 'has no run', as if the partner existed."""
    path = registry_file("partners:" + GOOD)
    ensure_schema(conn)
    status, _, err = run(capsys, "progress", "nosuch", "--database-url", db)
    assert status == 1 and err.strip() == (
        f"partner-harvest progress: partner 'nosuch' is not in the registry {path} "
        "(`partner-harvest validate` lists its partners)")
