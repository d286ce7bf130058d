"""``partner-harvest status``: the partner health table (the UI page's rows) in a terminal."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

import psycopg

from partner_harvest import durations
from partner_harvest.failures import shorten
from partner_harvest.registry import Partner, RegistryError
from partner_harvest.store.health import SchedulerRun, partner_health


def partner_overview(
    conn: psycopg.Connection, partners: list[Partner], now: datetime,
    scheduler_runs: Mapping[str, SchedulerRun] | None = None, registry_errors: Iterable[RegistryError] = (),
) -> tuple[list[dict[str, Any]], list[tuple[str, str, str | None]]]:
    """The health page's rows (``store.health.partner_health``), one flat line per partner,
    and the causes of their states (partner, state, cause) to print in full under the table.

    State (worst first, ``partner_state.TABLE``); records held and quarantined now (the
    apply's counters, no count(*)), the newest run, the cursor and how far it trails the
    partner's clock, that clock when it is not ours, the data-quality alerts of the newest
    successful run (counted: a failure is the state), and the short cause or the first alert;
    a run awaiting approval also names its request in Required Actions.
    """
    overview: list[dict[str, Any]] = []
    causes: list[tuple[str, str, str | None]] = []
    for health in partner_health(conn, partners, now, scheduler_runs, registry_errors):
        last = health.last_run
        first_line = health.short_cause
        offset = health.clock_offset
        overview.append({
            "partner": health.partner_id, "protocol": health.protocol, "state": health.state,
            "records": health.records_held, "quarantined": health.quarantined_now,
            "last_run": last.status if last else None, "started": last.started_at if last else None,
            "last_success": health.last_success.ended_at if health.last_success else None,
            "cursor": health.cursor, "behind": _duration(health.cursor_lag),
            "partner_clock": (f"{health.partner_clock:%Y-%m-%d %H:%M} ({_duration(abs(offset))} "
                              f"{'behind' if offset.total_seconds() > 0 else 'ahead'})") if offset is not None else None,
            "dq_alerts": len(health.alerts),  # data-quality findings; a failure is the state, not a count
            "note": shorten(first_line or (health.alerts[0] if health.alerts else ""), 80) or None,
        })
        if health.cause:
            answer = f" (answer: {ui_base_url()}{health.approval_path})" if health.approval_path else ""
            causes.append((health.partner_id, health.state, f"{first_line}{answer}"))
    return overview, causes


def ui_base_url() -> str:
    """The Airflow UI's base URL, when this environment says it (the REST API's
    HARVEST_AIRFLOW_API_URL, as ``scripts/airflow_ui.sh env`` exports it, or ``[api] base_url``
    as AIRFLOW__API__BASE_URL); else links are printed from the UI's root."""
    return (os.environ.get("HARVEST_AIRFLOW_API_URL") or os.environ.get("AIRFLOW__API__BASE_URL") or "").rstrip("/")


def scheduler_runs(partners: list[Partner]) -> tuple[dict[str, SchedulerRun] | None, str | None]:
    """Each partner's newest harvest DAG run from Airflow's database, as the health page reads
    it; or None and why not (the states then come from the aggregation database alone: a run
    between tries reads ``retrying`` from its failed try's event, a queued run is not seen)."""
    from partner_harvest.cli import airflow_side

    if not airflow_side.configured():
        return None, (f"no {airflow_side.SYNC_URL_ENV} and no {airflow_side.airflow_home()}/airflow.cfg here; "
                      f"{airflow_side.LOCAL_UI_HINT}")
    try:
        airflow_side.admin("reading Airflow's DAG runs")
        from partner_harvest.airflow.health.source import latest_harvest_runs

        return latest_harvest_runs(partners), None
    except airflow_side.AirflowUnreachable as exc:
        return None, str(exc)
    except Exception as exc:  # a database Airflow cannot read: say so, the aggregation's view still stands
        return None, f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"


def _duration(value: timedelta | None) -> str | None:
    return None if value is None else durations.human(value)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M")
    if isinstance(value, timedelta):
        return durations.human(value)
    return str(value)


def _as_mapping(row: Any) -> Mapping[str, Any]:
    if isinstance(row, Mapping):
        return row
    if dataclasses.is_dataclass(row) and not isinstance(row, type):
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
