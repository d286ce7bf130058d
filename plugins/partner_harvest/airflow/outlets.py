"""A run's outlets in Airflow (``run.Outlets``): where the recipe's results leave the library.

The cursors are Airflow Variables; a staged channel and an applied run are reported to
Airflow's hook lineage collector (staging written; staging read, the live tables written),
an applied run's figures to its Stats (metrics.py), its changes as the event on the
partner's Asset (assets.py), and a moved cursor as its lag. An ordinary night's tasks and a
quiet night's one task report through the same outlets, so the two cannot drift apart; only
the Asset event's way differs (a quiet night's goes through freeze_window's alias, quiet.py).
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

import psycopg
from airflow.sdk import Context

from partner_harvest.airflow import assets, lineage, metrics, quiet
from partner_harvest.airflow.cursor import read_cursor, write_cursor
from partner_harvest.airflow.hooks import AGGREGATION
from partner_harvest.run import CHANGES
from partner_harvest.store import ApplyResult
from partner_harvest.store.quality import run_figures
from partner_harvest.window import parse_instant

log = logging.getLogger(__name__)


class TaskOutlets:
    """The outlets of one task of the partner's harvest DAG (``quiet``: a quiet night's freeze_window)."""

    def __init__(self, partner_id: str, context: Context, *, quiet: bool = False) -> None:
        self.partner_id, self.context, self.quiet = partner_id, context, quiet

    def cursor(self, channel: str) -> datetime | None:
        return read_cursor(self.partner_id, None if channel == CHANGES else channel)

    def write_cursor(self, channel: str, value: dict[str, str]) -> None:
        write_cursor(self.partner_id, value, None if channel == CHANGES else channel)

    def staging(self, conn: psycopg.Connection, channel: str) -> None:
        lineage.wrote(AGGREGATION, lineage.tables(conn, lineage.STAGING))

    def applied(self, conn: psycopg.Connection, partner_id: str, run_id: str, result: ApplyResult) -> None:
        """Lineage, metrics and the Asset event of the applied run; it is applied already, so
        nothing here may fail the task."""
        lineage.read(AGGREGATION, lineage.tables(conn, lineage.STAGING))
        lineage.wrote(AGGREGATION, lineage.tables(conn, lineage.APPLIED))
        try:
            warnings = run_figures(conn, partner_id, run_id).warnings
        except Exception as exc:
            conn.rollback()
            log.warning("%s: the run's warnings are not in its metrics: %s", partner_id, exc)
            warnings = {}
        dag_run = self.context["dag_run"]
        metrics.send_apply(partner_id, result.as_dict(), warnings, getattr(dag_run, "start_date", None))
        extra = assets.event_extra(conn, partner_id, run_id, dag_run.run_id)
        conn.commit()  # the reads above leave no transaction open: what the caller writes next commits alone
        if self.quiet:
            quiet.emit_event(self.context, partner_id, extra)
        else:
            assets.emit(self.context, partner_id, extra)

    def moved(self, partner_id: str, moved: dict[str, dict[str, Any]]) -> None:
        """The main cursor's lag, from where the move left it (no second read of the Variable)."""
        cursor = moved[CHANGES]["cursor"]
        metrics.send_cursor_lag(partner_id, parse_instant(cursor) if cursor else None)
