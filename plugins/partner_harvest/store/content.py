"""SQL of the content check and the content refresh (content_check.py says why).

``partner_content`` holds, per partner, what the newest check found and whether a content
refresh is due; ``harvest_runs`` holds each reconcile's figures (``content_*``) and, on a
refresh run's rows, why it was one (``refresh``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

# Held records the sweep listed live, in an order of the run's own (a different sample each
# reconcile, the same on a retry of the same run).
_SAMPLE = """
SELECT r.identifier, r.datestamp, r.content_hash, r.metadata, r.set_specs FROM records r
WHERE r.partner_id = %(pid)s
  AND EXISTS (SELECT 1 FROM reconcile_ids u WHERE u.partner_id = %(pid)s AND u.run_id = %(run)s
              AND u.identifier = r.identifier AND NOT u.deleted)
ORDER BY md5(r.identifier || %(run)s) LIMIT %(n)s
"""


@dataclass(frozen=True)
class Held:
    identifier: str
    datestamp: datetime
    content_hash: str
    metadata: str
    set_specs: tuple[str, ...]


def held_count(conn: psycopg.Connection, partner_id: str) -> int:
    row = conn.execute("SELECT COALESCE((SELECT records_held FROM partner_stats WHERE partner_id = %s), 0)",
                       (partner_id,)).fetchone()
    conn.commit()
    return int(row[0]) if row else 0


def sample(conn: psycopg.Connection, partner_id: str, run_id: str, size: int, chunk: int) -> Iterator[list[Held]]:
    """The check's sample of held records, ``chunk`` at a time (streamed: memory is a chunk)."""
    with conn.transaction(), conn.cursor(name="content_sample") as cur:
        cur.itersize = chunk
        cur.execute(_SAMPLE, {"pid": partner_id, "run": run_id, "n": size})
        batch: list[Held] = []
        for identifier, datestamp, digest, metadata, set_specs in cur:
            batch.append(Held(identifier, datestamp, digest, metadata, tuple(set_specs or ())))
            if len(batch) >= chunk:
                yield batch
                batch = []
        if batch:
            yield batch


def record_check(conn: psycopg.Connection, partner_id: str, run_id: str, channel: str, *, sampled: int,
                 silent: int, requests: int, examples: list[dict[str, Any]], refresh: str | None) -> None:
    """The check's figures on the reconcile's audit row and the partner's state, in one
    transaction: the count of checks, unreliable datestamps (set by a finding, cleared by a
    clean check), and a refresh due (kept until a refresh applies)."""
    with conn.transaction():
        conn.execute(
            "UPDATE harvest_runs SET content_sampled = %s, content_silent = %s, content_requests = %s"
            " WHERE partner_id = %s AND run_id = %s AND channel = %s",
            (sampled, silent, requests, partner_id, run_id, channel))
        conn.execute(
            """
            INSERT INTO partner_content AS c (partner_id, checks, last_check_run, last_checked_at, last_sampled,
                                              last_silent, unreliable_since, examples, refresh_due, refresh_due_since)
            VALUES (%(pid)s, 1, %(run)s, now(), %(sampled)s, %(silent)s,
                    CASE WHEN %(silent)s > 0 THEN now() END, %(examples)s, %(refresh)s,
                    CASE WHEN %(refresh)s::text IS NOT NULL THEN now() END)
            ON CONFLICT (partner_id) DO UPDATE SET
                checks = c.checks + 1, last_check_run = EXCLUDED.last_check_run, last_checked_at = now(),
                last_sampled = EXCLUDED.last_sampled, last_silent = EXCLUDED.last_silent,
                unreliable_since = CASE WHEN EXCLUDED.last_silent > 0 THEN COALESCE(c.unreliable_since, now()) END,
                examples = CASE WHEN EXCLUDED.last_silent > 0 THEN EXCLUDED.examples ELSE c.examples END,
                refresh_due = COALESCE(c.refresh_due, EXCLUDED.refresh_due),
                refresh_due_since = COALESCE(c.refresh_due_since, EXCLUDED.refresh_due_since)
            """,
            {"pid": partner_id, "run": run_id, "sampled": sampled, "silent": silent, "examples": Jsonb(examples),
             "refresh": refresh})


def checks_done(conn: psycopg.Connection, partner_id: str) -> int:
    row = conn.execute("SELECT checks FROM partner_content WHERE partner_id = %s", (partner_id,)).fetchone()
    conn.commit()
    return int(row[0]) if row else 0


def refresh_due(conn: psycopg.Connection, partner_id: str) -> str | None:
    """Why the partner's next incremental run must be a content refresh, or None."""
    row = conn.execute("SELECT refresh_due FROM partner_content WHERE partner_id = %s", (partner_id,)).fetchone()
    conn.commit()
    return row[0] if row else None


# Inside the apply: a refresh run that applies settles the refresh due since before it began.
REFRESHED = """
UPDATE partner_content c SET refresh_due = NULL, refresh_due_since = NULL, last_refresh_run = %(run)s,
       last_refresh_at = now()
WHERE c.partner_id = %(pid)s AND c.refresh_due IS NOT NULL
  AND EXISTS (SELECT 1 FROM harvest_runs h WHERE h.partner_id = %(pid)s AND h.run_id = %(run)s
              AND h.refresh IS NOT NULL AND h.started_at >= c.refresh_due_since)
"""


def state(conn: psycopg.Connection, partner_id: str) -> dict[str, Any] | None:
    """The partner's content-check state (health page, status), or None before its first check."""
    cur = conn.execute("SELECT * FROM partner_content WHERE partner_id = %s", (partner_id,))
    row = cur.fetchone()
    names = [d.name for d in cur.description or ()]
    conn.commit()
    return dict(zip(names, row)) if row else None


def notes(conn: psycopg.Connection, partner_ids: list[str]) -> list[tuple[str, str]]:
    """One line per partner whose datestamps are unreliable or that has a refresh due
    (``partner-harvest status``)."""
    rows = conn.execute(
        "SELECT partner_id, unreliable_since, last_sampled, last_silent, examples, refresh_due, last_refresh_run"
        " FROM partner_content WHERE partner_id = ANY(%s) AND (unreliable_since IS NOT NULL OR refresh_due IS NOT NULL)"
        " ORDER BY partner_id", (partner_ids,)).fetchall()
    conn.commit()
    out = []
    for pid, since, sampled, silent, examples, due, last_refresh in rows:
        parts = []
        if since is not None:
            named = ", ".join(e["identifier"] for e in (examples or [])[:3])
            parts.append(f"datestamps unreliable since {since:%Y-%m-%d}: {silent} of {sampled} sampled records "
                         f"changed without a new datestamp (e.g. {named})")
        parts.append(f"content refresh due: {due}" if due else f"last content refresh {last_refresh or 'none'}")
        out.append((pid, "; ".join(parts)))
    return out
