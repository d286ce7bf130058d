"""The soak's check has teeth: a mirror that differs from the partner in any way the soak
promises to catch is reported (no Airflow here; the mirror is written by hand)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

import psycopg
import pytest

from benchmarks.soak.driver import PARTNERS, Night, Partner, Soak

PID = "soak_persistent"
RUN = f"harvest_{PID}/manual__1"


@pytest.fixture
def partner() -> Iterator[Partner]:
    p = Partner(PARTNERS[PID], seed=3, size=60)
    yield p
    p.close()


def mirror(conn: psycopg.Connection, oracle: dict) -> None:
    """A mirror that equals the partner: records, and the invalid ones quarantined."""
    stamp = datetime(2026, 6, 1, tzinfo=timezone.utc)
    for identifier, (title, sets) in oracle["expect"].items():
        conn.execute("INSERT INTO records (partner_id, identifier, datestamp, metadata_prefix, metadata, set_specs,"
                     " title, content_hash, run_id) VALUES (%s, %s, %s, 'oai_dc', '<x/>', %s, %s, 'h', %s)",
                     (PID, identifier, stamp, list(sets), title, RUN))
    for identifier in oracle["invalid"]:
        conn.execute("INSERT INTO quarantine (partner_id, identifier, reason, raw_payload, run_id)"
                     " VALUES (%s, %s, 'no title', '<x/>', %s)", (PID, identifier, RUN))
    conn.commit()


TAMPERING = {
    "missing": ("DELETE FROM records WHERE identifier = (SELECT min(identifier) FROM records)", "live upstream but missing"),
    "stale": ("UPDATE records SET title = title || ' (old)' WHERE identifier = (SELECT max(identifier) FROM records)",
              "stale content"),
    "sets": ("UPDATE records SET set_specs = '{type}' WHERE identifier = (SELECT max(identifier) FROM records)",
             "stale content"),
    "ghost": (f"INSERT INTO records (partner_id, identifier, datestamp, metadata_prefix, metadata, title, content_hash,"
              f" run_id) VALUES ('{PID}', 'oai:sim.example:rec-9999999', now(), 'oai_dc', '', 't', 'h', '{RUN}')",
              "held but not live upstream"),
    "lease": (f"INSERT INTO partner_leases (partner_id, holder, kind, expires_at) VALUES ('{PID}', '{RUN}', 'harvest',"
              " now() + interval '1 minute')", "outlives its run"),
    "quarantined": (f"INSERT INTO quarantine (partner_id, identifier, reason, raw_payload, run_id, observed_at)"
                    f" SELECT '{PID}', min(identifier), 'x', '', '{RUN}', 'infinity' FROM records", "valid records quarantined"),
    "unquarantined": ("DELETE FROM quarantine", "invalid records not quarantined"),
    "counts": (f"INSERT INTO harvest_runs (partner_id, run_id, channel, mode, status, fetched, upserted)"
               f" VALUES ('{PID}', '{RUN}', 'changes', 'incremental', 'applied', 5, 4)", "counts do not add up"),
}


@pytest.mark.parametrize("tamper", [None, *TAMPERING])
def test_the_check_reports_every_kind_of_divergence(conn: psycopg.Connection, db: str, partner: Partner, tmp_path: Path, pg_label: str,
                                                    tamper: str | None) -> None:
    soak = Soak(seed=1, nights=1, partners=[PID], conninfo=db, pg_label=pg_label, workdir=tmp_path)
    oracle = {**partner.snapshot(), "excused": set()}
    assert oracle["invalid"] and len(oracle["expect"]) > 20
    mirror(conn, oracle)
    if tamper:
        conn.execute(TAMPERING[tamper][0])
        conn.commit()
    night = Night(PID, 2, "none")
    soak._check(partner, night, oracle, succeeded=True)
    if tamper is None:
        assert night.divergence == [] and night.checked == "strict"
    else:
        assert any(TAMPERING[tamper][1] in line for line in night.divergence), night.divergence


def test_a_missing_deletion_is_reported(conn: psycopg.Connection, db: str, partner: Partner, tmp_path: Path, pg_label: str) -> None:
    soak = Soak(seed=1, nights=1, partners=[PID], conninfo=db, pg_label=pg_label, workdir=tmp_path)
    oracle = {**partner.snapshot(), "excused": set()}
    mirror(conn, oracle)
    soak._check(partner, Night(PID, 1, "none"), oracle, succeeded=True)
    gone = partner.records.delete(2)  # an OAI-PMH partner (soak_persistent)
    conn.execute("DELETE FROM records WHERE identifier = ANY(%s)", (gone,))  # purged, but no deletions row
    conn.commit()
    night = Night(PID, 2, "none")
    soak._check(partner, night, {**partner.snapshot(), "excused": set()}, succeeded=True)
    assert any("upstream deletions not in deletions" in line for line in night.divergence), night.divergence


def test_a_cursor_that_moves_backwards_is_reported(db: str, tmp_path: Path, pg_label: str) -> None:
    soak = Soak(seed=1, nights=1, partners=[PID], conninfo=db, pg_label=pg_label, workdir=tmp_path)
    first, second = Night(PID, 1, "none"), Night(PID, 2, "none")
    soak._check_cursors(first, {"cursors": {"k": {"until": "2026-06-02T00:00:00Z"}}})
    soak._check_cursors(second, {"cursors": {"k": {"until": "2026-06-01T23:00:00Z"}}})
    assert not first.divergence and "moved backwards" in second.divergence[0]
