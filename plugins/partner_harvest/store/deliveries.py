"""SQL of file deliveries (files/): the files each run read, and which deliveries were applied."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import psycopg

from partner_harvest.store import fences
from partner_harvest.store.runs import RunRef


@dataclass(frozen=True)
class ReadFile:
    """One file a run read to its end (a row of ``delivery_files``)."""

    delivered: datetime
    kind: str
    path: str
    size: int
    etag: str | None
    checksum: str | None
    records: int = 0


def record_file(conn: psycopg.Connection, run: RunRef, read: ReadFile) -> None:
    """The file is read to its end: its row in the run's audit (a retried try rewrites it)."""
    with conn.transaction():
        fences.check(conn, f"delivery audit of {run.channel} of run {run.run_id}")
        conn.execute(
            """
            INSERT INTO delivery_files (partner_id, run_id, channel, delivered, kind, path, size, etag, checksum, records)
            VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
            ON CONFLICT (partner_id, run_id, channel, path) DO UPDATE SET
                delivered = EXCLUDED.delivered, kind = EXCLUDED.kind, size = EXCLUDED.size, etag = EXCLUDED.etag,
                checksum = EXCLUDED.checksum, records = EXCLUDED.records, read_at = now()
            """,
            (*run.key(), read.delivered, read.kind, read.path, read.size, read.etag, read.checksum, read.records),
        )


def applied_files(conn: psycopg.Connection, partner_id: str) -> list[ReadFile]:
    """Each file of each applied delivery as the newest applied run read it (delivery, kind, path)."""
    rows = conn.execute(
        """
        SELECT DISTINCT ON (d.delivered, d.kind, d.path) d.delivered, d.kind, d.path, d.size, d.etag, d.checksum,
               d.records
        FROM delivery_files d
        JOIN harvest_runs h ON h.partner_id = d.partner_id AND h.run_id = d.run_id AND h.channel = d.channel
        WHERE d.partner_id = %s AND h.status = 'applied'
        ORDER BY d.delivered, d.kind, d.path, h.applied_at DESC
        """,
        (partner_id,),
    ).fetchall()
    conn.commit()
    return [ReadFile(*row) for row in rows]

