"""``partner-harvest status``: the partner health table (the UI page's rows) in a terminal."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

import psycopg

from partner_harvest.registry import Partner
from partner_harvest.store.health import partner_health


def partner_overview(conn: psycopg.Connection, partners: list[Partner], now: datetime) -> list[dict[str, Any]]:
    """The health page's rows (``store.health.partner_health``), one flat line per partner.

    State (worst first): failing, behind, warning, new, healthy; then records held and
    quarantined now (the apply's counters, no count(*)), the newest run, the cursor and
    how far it trails ``now``, and the first open alert.
    """
    overview = []
    for health in partner_health(conn, partners, now):
        last = health.last_run
        error = (last.error or "").splitlines()[0][:80] if last and last.error else None
        overview.append({
            "partner": health.partner_id, "protocol": health.protocol, "state": health.state,
            "records": health.records_held, "quarantined": health.quarantined_now,
            "last_run": last.status if last else None, "started": last.started_at if last else None,
            "last_success": health.last_success.ended_at if health.last_success else None,
            "cursor": health.cursor, "behind": _duration(health.cursor_lag),
            "alerts": len(health.alerts), "note": error or (health.alerts[0][:80] if health.alerts else None),
        })
    return overview


def _duration(value: timedelta | None) -> str | None:
    if value is None:
        return None
    hours = int(value.total_seconds() // 3600)
    return f"{hours // 24}d {hours % 24}h" if hours >= 24 else f"{hours}h {int(value.total_seconds() % 3600 // 60)}m"


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
