"""``partner-harvest status``: one line per partner, from harvest_runs and records.

:func:`partner_overview` is the single seam: when ``store/health.py`` lands, its body
becomes ``return partner_health(conn, partners, now)``; :func:`render_table` prints any
list of mappings or dataclasses, so nothing else changes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

import psycopg

from partner_harvest.registry import Partner

_OVERVIEW_SQL = """
WITH latest AS (
    SELECT DISTINCT ON (partner_id) partner_id, status, mode, started_at, error
    FROM harvest_runs WHERE partner_id = ANY(%(ids)s) AND channel <> 'reconcile'
    ORDER BY partner_id, started_at DESC, channel
), applied AS (
    SELECT partner_id, max(applied_at) AS last_applied_at
    FROM harvest_runs WHERE partner_id = ANY(%(ids)s) AND status = 'applied'
    GROUP BY partner_id
), recs AS (
    SELECT partner_id, count(*) AS records FROM records WHERE partner_id = ANY(%(ids)s) GROUP BY partner_id
), broken AS (
    SELECT partner_id, count(*) AS quarantined FROM quarantine_current
    WHERE partner_id = ANY(%(ids)s) GROUP BY partner_id
)
SELECT p.id, recs.records, broken.quarantined, latest.status, latest.mode, latest.started_at,
       applied.last_applied_at, latest.error
FROM unnest(%(ids)s::text[]) AS p(id)
LEFT JOIN latest ON latest.partner_id = p.id
LEFT JOIN applied ON applied.partner_id = p.id
LEFT JOIN recs ON recs.partner_id = p.id
LEFT JOIN broken ON broken.partner_id = p.id
ORDER BY p.id
"""


def partner_overview(conn: psycopg.Connection, partners: list[Partner], now: datetime) -> list[dict[str, Any]]:
    """SEAM (switch to ``store.health.partner_health(conn, partners, now)`` at merge).

    Per partner: records held, records quarantined now, the newest harvest run (status,
    mode, start, error) and the last apply; ``state`` is ``failing`` when the newest run
    failed, ``quiet`` when nothing applied within the partner's ``quiet_period``.
    """
    by_id = {p.id: p for p in partners}
    rows = conn.execute(_OVERVIEW_SQL, {"ids": list(by_id)}).fetchall()
    conn.commit()
    overview = []
    for pid, records, quarantined, status, mode, started_at, applied_at, error in rows:
        partner = by_id[pid]
        if status is None:
            state = "never run"
        elif status == "failed":
            state = "failing"
        elif status in ("harvesting", "harvested"):
            state = "running"
        elif applied_at is None or now - applied_at > partner.quiet_period:
            state = "quiet"
        else:
            state = "ok"
        overview.append({
            "partner": pid, "protocol": partner.protocol, "state": state, "records": records or 0,
            "quarantined": quarantined or 0, "last_run": status, "mode": mode, "started": started_at,
            "last_applied": applied_at, "error": (error or "").splitlines()[0][:80] if error else None,
        })
    return overview


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M")
    if isinstance(value, timedelta):
        return str(value)
    return str(value)


def _as_mapping(row: Any) -> Mapping[str, Any]:
    if isinstance(row, Mapping):
        return row
    if dataclasses.is_dataclass(row):
        return dataclasses.asdict(row)
    if hasattr(row, "_asdict"):
        return row._asdict()
    return vars(row)


def render_table(rows: Iterable[Any]) -> str:
    """A plain-text table; columns are the keys of the first row."""
    mappings = [_as_mapping(row) for row in rows]
    if not mappings:
        return "(no partners)"
    columns = list(mappings[0])
    cells = [[_cell(m.get(c)) for c in columns] for m in mappings]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    line = lambda values: "  ".join(v.ljust(w) for v, w in zip(values, widths)).rstrip()  # noqa: E731
    return "\n".join([line(columns), line(["-" * w for w in widths]), *(line(r) for r in cells)])
