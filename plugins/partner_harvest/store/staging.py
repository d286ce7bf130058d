"""Streaming a window into the staging table with COPY, one page per transaction."""

from __future__ import annotations

import psycopg

from partner_harvest.records import HarvestItem, Record, Rejected, Tombstone
from partner_harvest.store.runs import RunRef

_COPY = (
    "COPY staging (partner_id, run_id, channel, seq, kind, identifier, datestamp,"
    " metadata_prefix, metadata, set_specs, title, content_hash, reason) FROM STDIN"
)


class StagingWriter:
    """Writes harvest items for one run channel; memory is bounded by one page (I5)."""

    def __init__(self, conn: psycopg.Connection, run: RunRef):
        self.conn = conn
        self.run = run
        self.seq = 0

    def reset(self) -> None:
        """Drop what this channel staged so far: the window restarts from its bounds."""
        with self.conn.transaction():
            self.conn.execute(
                "DELETE FROM staging WHERE partner_id = %s AND run_id = %s AND channel = %s",
                self.run.key(),
            )
        self.seq = 0

    def write_page(self, items: list[HarvestItem]) -> None:
        if not items:
            return
        pid, run_id, channel = self.run.key()
        with self.conn.transaction(), self.conn.cursor() as cur, cur.copy(_COPY) as copy:
            for item in items:
                self.seq += 1
                copy.write_row(_row(pid, run_id, channel, self.seq, item))


def _row(pid: str, run_id: str, channel: str, seq: int, item: HarvestItem) -> tuple:
    if isinstance(item, Record):
        return (
            pid, run_id, channel, seq, "R", item.identifier, item.datestamp, item.metadata_prefix,
            item.metadata, list(item.set_specs), item.title, item.content_hash, None,
        )
    if isinstance(item, Tombstone):
        return (pid, run_id, channel, seq, "T", item.identifier, item.datestamp,
                None, None, None, None, None, None)
    if isinstance(item, Rejected):
        return (
            pid, run_id, channel, seq, "Q", item.identifier, item.datestamp, item.metadata_prefix,
            item.raw, None, None, None, item.reason,
        )
    raise TypeError(f"not a harvest item: {type(item).__name__}")
