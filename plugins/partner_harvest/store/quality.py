"""Figures a data-quality check needs from the audit and the live tables."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import psycopg


@dataclass(frozen=True)
class RunFigures:
    fetched: int
    purged: int
    quarantined: int
    held: int  # records held for the partner after the run
    last_fetch_at: datetime | None  # newest applied run that fetched anything
    first_run_at: datetime | None  # oldest run on record
    announced: int | None = None  # completeListSize, when it disagreed with what came


def run_figures(conn: psycopg.Connection, partner_id: str, run_id: str) -> RunFigures:
    row = conn.execute(
        """
        SELECT COALESCE(sum(fetched), 0), COALESCE(sum(purged), 0), COALESCE(sum(quarantined), 0),
               (SELECT count(*) FROM records WHERE partner_id = %(pid)s),
               (SELECT max(applied_at) FROM harvest_runs
                 WHERE partner_id = %(pid)s AND status = 'applied' AND fetched > 0),
               (SELECT min(started_at) FROM harvest_runs WHERE partner_id = %(pid)s),
               max(complete_list_size) FILTER (WHERE list_size_mismatch)
        FROM harvest_runs WHERE partner_id = %(pid)s AND run_id = %(run)s
        """,
        {"pid": partner_id, "run": run_id},
    ).fetchone()
    conn.commit()
    return RunFigures(*row)
