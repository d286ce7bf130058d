"""Downstream export of a partner's change feed as JSON Lines (no Airflow here).

One file per exported range, named by it: ``<dir>/<partner>/changes_<after>_<until>.jsonl``
(zero-padded, so names sort in feed order) holds the partner's changes with
``after < change_seq <= until`` in ``change_seq`` order. A consumer applies the files in
name order and the lines in file order.

Crash safety: the range is fixed (committed) before the file is written, the file is
written to a temporary name, fsynced and renamed, and only then the position moves. A
crash anywhere leaves the position where it was with the range still pending, and the
rerun writes the SAME range to the SAME name again: no change is missed, none is
handed out in two files.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg

from partner_harvest.store import feed


@dataclass(frozen=True)
class Exported:
    """One export of one partner: the range, what it held, and the file."""

    partner_id: str
    after: int
    until: int
    upserts: int
    deletes: int
    path: str
    resumed: bool
    moves: int = 0
    attached: int = 0  # attachments, attached_upsert and attached_delete lines (items and holdings)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def file_name(span: feed.ExportRange) -> str:
    return f"changes_{span.after:020d}_{span.until:020d}.jsonl"


def line(partner_id: str, change: dict[str, Any]) -> dict[str, Any]:
    """One change as a JSON object: ``op`` is ``upsert`` (the record's current version), ``delete``,
    ``moved`` (the record held as ``from_identifier`` is ``identifier`` from now on; with its
    current version unless it changed again since, in a later change), ``attachments`` (the
    record's items or holdings changed), ``attached_upsert`` or ``attached_delete`` (one item
    or holdings record, with ``entity``)."""
    out: dict[str, Any] = {"seq": change["change_seq"], "op": change["op"], "partner_id": partner_id,
                           "identifier": change["identifier"]}
    op = change["op"]
    if op == "moved":
        out["from_identifier"] = change["moved_from"]
    if op in ("upsert", "moved") and change["metadata"] is not None:
        out.update(datestamp=_iso(change["datestamp"]), metadata_prefix=change["metadata_prefix"],
                   set_specs=list(change["set_specs"] or []), title=change["title"],
                   content_hash=change["content_hash"], metadata=change["metadata"])
    elif op == "delete":
        out.update(upstream_datestamp=_iso(change["datestamp"]), reason=change["reason"])
    elif op == "attached_upsert":  # an item or holdings record: its table, its records, its JSON
        out.update(entity=change["metadata_prefix"], bib_ids=list(change["set_specs"] or []),
                   datestamp=_iso(change["datestamp"]), content_hash=change["content_hash"],
                   content=json.loads(change["metadata"]))
    elif op == "attached_delete":
        out.update(entity=change["metadata_prefix"], bib_ids=list(change["set_specs"] or []),
                   upstream_datestamp=_iso(change["datestamp"]), reason=change["reason"])
    # op "attachments": the record ``identifier`` whose items or holdings changed: nothing more
    out.update(run_id=change["run_id"], changed_at=_iso(change["changed_at"]))
    return out


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


def write_range(conn: psycopg.Connection, span: feed.ExportRange, directory: str | os.PathLike[str]) -> Exported:
    """Write the range's changes atomically (temp file, fsync, rename, fsync the directory)."""
    folder = Path(directory) / span.partner_id
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / file_name(span)
    counts = {"upsert": 0, "delete": 0, "moved": 0, "attachments": 0, "attached_upsert": 0, "attached_delete": 0}
    fd, temp = tempfile.mkstemp(dir=folder, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as out:
            for change in feed.changes(conn, span.partner_id, span.after, span.until):
                counts[change["op"]] += 1
                out.write(json.dumps(line(span.partner_id, change), ensure_ascii=False) + "\n")
            out.flush()
            os.fsync(out.fileno())
        os.replace(temp, target)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return Exported(span.partner_id, span.after, span.until, counts["upsert"], counts["delete"], str(target),
                    span.resumed, counts["moved"],
                    counts["attachments"] + counts["attached_upsert"] + counts["attached_delete"])


def export_jsonl(conn: psycopg.Connection, consumer: str, partner_id: str,
                 directory: str | os.PathLike[str]) -> Exported | None:
    """Export the partner's changes since the consumer's position; None when there are none."""
    span = feed.begin_export(conn, consumer, partner_id)
    if span is None:
        return None
    exported = write_range(conn, span, directory)
    feed.finish_export(conn, span)
    return exported
