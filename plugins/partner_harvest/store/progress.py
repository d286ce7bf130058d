"""A run's channels (its slices) while it runs, with rate and time left: ``partner-harvest
progress`` and the partner health page.

Every channel writes ``pages``, ``fetched`` and ``progress_at`` to its ``harvest_runs`` row
after each staged page, and ``expected`` holds what it should bring (the plan's estimate,
then the partner's announced count). From those: records per second since the channel's
current try began, and the time left at that rate. Times are the database's, so a
terminal on another machine with a skewed clock reads the same figures.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import psycopg

from partner_harvest import durations
from partner_harvest.store import slices
from partner_harvest.store.db import scalar
from partner_harvest.window import format_instant

RUNNING = ("harvesting", "waiting")
DONE = ("harvested", "applied")


def newest_run_id(conn: psycopg.Connection, partner_id: str, *, unfinished: bool = False) -> str | None:
    """The partner's run that started last (its slices share the run id); with
    ``unfinished``, only while it is not applied (running, or failed and not yet retried or given up)."""
    row = conn.execute(
        "SELECT run_id, bool_or(status NOT IN ('applied', 'abandoned')) FROM harvest_runs"
        " WHERE partner_id = %s GROUP BY run_id ORDER BY max(started_at) DESC, run_id DESC LIMIT 1",
        (partner_id,),
    ).fetchone()
    conn.commit()
    if row is None or (unfinished and not row[1]):
        return None
    return row[0]


def database_now(conn: psycopg.Connection) -> datetime:
    """The database's clock, which wrote every ``progress_at``."""
    now = scalar(conn.execute("SELECT statement_timestamp()"))
    conn.commit()
    return now


@dataclass(frozen=True)
class RunProgress:
    """One line per channel (the parent row of a sliced run left out: its slices are the work)."""

    run_id: str
    channels: list[dict[str, Any]]
    fetched: int
    expected: int | None      # None when some unfinished channel has no estimate
    per_second: float         # the channels harvesting now, together
    time_left: timedelta | None
    running: bool             # some channel is planned, harvesting or waiting (else: failed or awaiting the apply)


def run_progress(rows: list[dict[str, Any]], run_id: str, now: datetime) -> RunProgress:
    """The run's progress from its ``harvest_runs`` rows (``store.slices.slice_rows``) at ``now``."""
    sliced = any(slices.is_slice(r["channel"]) for r in rows)
    rows = [r for r in rows if not (sliced and r["channel"] == slices.PARENT)]
    channels = [_channel(r, now) for r in rows]
    unfinished = [c for c in channels if c["status"] not in DONE]
    remaining = [_left(c) for c in unfinished]
    per_second = sum(_rate(r) or 0.0 for r in rows if r["status"] == "harvesting")
    time_left = None
    known = [left for left in remaining if left is not None]
    if len(known) == len(remaining) and per_second > 0:
        time_left = timedelta(seconds=round(sum(known) / per_second))
    elif not unfinished:
        time_left = timedelta(0)
    known = [c["fetched"] if c["status"] in DONE else c["expected"] for c in channels]  # a finished one: what came
    return RunProgress(
        run_id=run_id, channels=channels, fetched=sum(c["fetched"] or 0 for c in channels),
        expected=None if None in known else sum(known), per_second=per_second, time_left=time_left,
        running=any(c["status"] in ("planned", *RUNNING) for c in channels),
    )


def _channel(row: dict[str, Any], now: datetime) -> dict[str, Any]:
    fetched, expected, status, last = row["fetched"] or 0, row["expected"], row["status"], row["progress_at"]
    per_s = _rate(row)
    left = None
    if status in DONE:
        left = timedelta(0)
    elif status == "harvesting" and per_s and expected is not None:
        left = timedelta(seconds=round(max(expected - fetched, 0) / per_s))
    return {
        "channel": row["channel"], "status": status, "range": _range(row), "pages": row["pages"],
        "fetched": fetched, "expected": expected,
        "done": f"{min(fetched / expected, 1.0):.0%}" if expected else None,
        "per_s": round(per_s) if per_s is not None else None, "left": left,
        "last_page": max(now - last, timedelta(0)) if last is not None and status in RUNNING else None,
        "attempts": row["attempts"],
    }


def _rate(row: dict[str, Any]) -> float | None:
    """Records per second of the channel's current (or last) try, up to its last page."""
    since, last = row["harvesting_since"], row["progress_at"]
    if since is None or last is None or row["status"] == "planned":
        return None
    return (row["fetched"] or 0) / max((last - since).total_seconds(), 1.0)


def _left(channel: dict[str, Any]) -> int | None:
    """Records still to come in an unfinished channel, None when it has no estimate."""
    if channel["expected"] is None:
        return None
    return max(channel["expected"] - channel["fetched"], 0)


def _range(row: dict[str, Any]) -> str:
    if row.get("slice_paged"):  # an IIIF slice: page positions back from the frozen last page
        return f"pages {row['slice_lo']}..{row['slice_hi']}"
    if row["slice_lo"] is not None:
        return f"ids {row['slice_lo']}..{row['slice_hi']}"
    start = format_instant(row["window_from"]) if row["window_from"] else "the beginning"
    until = format_instant(row["window_until"]) if row["window_until"] else "?"
    return (f"set {row['slice_set']} " if row["slice_set"] else "") + f"{start}..{until}"


def summary_line(progress: RunProgress) -> str:
    expected = f" of {progress.expected:,}" if progress.expected is not None else ""
    left = "unknown (a channel has no estimate, or none is harvesting)" if progress.time_left is None \
        else durations.human(progress.time_left)
    return (f"run {progress.run_id}: {progress.fetched:,}{expected} records, "
            f"{progress.per_second:,.0f}/s now, time left {left}")


def current_progress(conn: psycopg.Connection, partner_id: str, run_id: str | None = None, *,
                     unfinished: bool = False) -> RunProgress | None:
    """The progress of ``run_id``, else of the partner's newest run (``unfinished``: only while
    it is not applied); None when there is no such run."""
    run_id = run_id or newest_run_id(conn, partner_id, unfinished=unfinished)
    if run_id is None:
        return None
    rows = slices.slice_rows(conn, partner_id, run_id)
    return run_progress(rows, run_id, database_now(conn)) if rows else None
