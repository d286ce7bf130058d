"""Figures a data-quality check needs from the audit and the live tables."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

import psycopg

from partner_harvest.store.db import one


@dataclass(frozen=True)
class RunFigures:
    fetched: int
    purged: int
    quarantined: int
    held: int  # records held for the partner right after the run's apply
    last_fetch_at: datetime | None  # newest applied run that fetched anything
    first_run_at: datetime | None  # oldest run on record
    announced: int | None = None  # completeListSize, when it disagreed with what came
    failed_checks: tuple[str, ...] = ()  # completeness checks (I12) that did not hold
    warnings: dict[str, int] = field(default_factory=dict)  # per validation check: records landed with it
    # the checks that warned on the partner's previous applied run; None: there is none
    previous_warnings: frozenset[str] | None = None
    purge_approved: bool = False  # a person approved the run's purges at its approval gate


def run_figures(conn: psycopg.Connection, partner_id: str, run_id: str) -> RunFigures:
    """The run's figures. ``held`` is what its apply noted on its rows (store/partner_stats.py):
    what the run left, even when a later run applied before this check, and no count over a
    big partner's records; counted only for a run applied before the rows carried it."""
    row = one(conn.execute(
        """
        SELECT COALESCE(sum(fetched), 0), COALESCE(sum(purged), 0), COALESCE(sum(quarantined), 0),
               COALESCE(max(records_held), (SELECT count(*) FROM records WHERE partner_id = %(pid)s)),
               (SELECT max(applied_at) FROM harvest_runs
                 WHERE partner_id = %(pid)s AND status = 'applied' AND fetched > 0),
               (SELECT min(started_at) FROM harvest_runs WHERE partner_id = %(pid)s),
               max(complete_list_size) FILTER (WHERE list_size_mismatch),
               EXISTS (SELECT 1 FROM approval_requests a WHERE a.partner_id = %(pid)s AND a.run_id = %(run)s
                       AND a.state IN ('approved', 'applied'))
        FROM harvest_runs WHERE partner_id = %(pid)s AND run_id = %(run)s
        """,
        {"pid": partner_id, "run": run_id},
    ))
    failed = conn.execute(
        """
        SELECT channel, check_kind, check_expected, check_found, check_detail FROM harvest_runs
        WHERE partner_id = %s AND run_id = %s AND check_ok = false ORDER BY channel
        """,
        (partner_id, run_id),
    ).fetchall()
    warnings: dict[str, int] = dict(conn.execute(
        """
        SELECT w.key, sum(w.value::bigint)::int FROM harvest_runs h, jsonb_each_text(h.warnings) AS w
        WHERE h.partner_id = %s AND h.run_id = %s GROUP BY w.key
        """,
        (partner_id, run_id),
    ).fetchall())
    previous = one(conn.execute(
        """
        WITH prev AS (
            SELECT run_id FROM harvest_runs
            WHERE partner_id = %(pid)s AND run_id <> %(run)s AND status = 'applied'
              AND started_at < (SELECT min(started_at) FROM harvest_runs WHERE partner_id = %(pid)s AND run_id = %(run)s)
            ORDER BY started_at DESC LIMIT 1
        )
        SELECT (SELECT run_id FROM prev),
               ARRAY(SELECT DISTINCT w.key FROM harvest_runs h JOIN prev USING (run_id), jsonb_each_text(h.warnings) AS w
                     WHERE h.partner_id = %(pid)s)
        """,
        {"pid": partner_id, "run": run_id},
    ))
    conn.commit()
    checks = tuple(
        f"{kind} on the {channel} channel: the witness says {expected if expected is not None else 'nothing'}, "
        f"the run holds {found if found is not None else 'unknown'}" + (f" ({detail})" if detail else "")
        for channel, kind, expected, found, detail in failed
    )
    fetched, purged, quarantined, held, last_fetch_at, first_run_at, announced, approved = row
    return RunFigures(fetched, purged, quarantined, held, last_fetch_at, first_run_at, announced,
                      failed_checks=checks, warnings=warnings,
                      previous_warnings=frozenset(previous[1]) if previous[0] is not None else None,
                      purge_approved=bool(approved))
