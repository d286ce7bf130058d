"""Window planning: frozen until, granularity, lag, modes, and a forward-only cursor (I1)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from partner_harvest.window import (
    DAY,
    SECONDS,
    Window,
    WindowError,
    WindowFacts,
    next_cursor,
    parse_instant,
    plan_window,
)

CLOCK = datetime(2026, 5, 10, 14, 33, 27, 123456, tzinfo=timezone.utc)
LAG = timedelta(minutes=10)


def plan(**kw: Any) -> Window:
    args: dict[str, Any] = dict(mode="incremental", partner_clock=CLOCK, granularity=SECONDS, lag=LAG, cursor_until=None)
    args.update(kw)
    return plan_window(**args)


def test_no_cursor_is_a_full_harvest_that_sets_the_cursor() -> None:
    window = plan()
    assert window.from_ is None and window.is_full
    assert window.until == datetime(2026, 5, 10, 14, 33, 27, tzinfo=timezone.utc)
    assert window.advances_cursor


def test_from_is_previous_until_minus_lag_at_seconds_granularity() -> None:
    window = plan(cursor_until=datetime(2026, 5, 9, 2, 0, 5, tzinfo=timezone.utc))
    assert window.to_dict()["from"] == "2026-05-09T01:50:05Z"
    assert window.to_dict()["until"] == "2026-05-10T14:33:27Z"


def test_day_granularity_floors_both_bounds() -> None:
    window = plan(granularity=DAY, cursor_until=datetime(2026, 5, 9, tzinfo=timezone.utc))
    assert window.from_ == datetime(2026, 5, 8, tzinfo=timezone.utc)  # 00:00 minus 10 min, floored
    assert window.until == datetime(2026, 5, 10, tzinfo=timezone.utc)


def test_partner_clock_behind_cursor_never_gives_from_after_until() -> None:
    window = plan(cursor_until=CLOCK + timedelta(days=2))
    assert window.from_ is not None and window.from_ <= window.until


def test_full_and_window_modes_never_advance() -> None:
    assert not plan(mode="full").advances_cursor
    window = plan(mode="window", requested_from=datetime(2026, 1, 1, tzinfo=timezone.utc))
    assert not window.advances_cursor and window.from_ == datetime(2026, 1, 1, tzinfo=timezone.utc)
    with pytest.raises(WindowError, match="needs the 'from' Param"):
        plan(mode="window")
    with pytest.raises(WindowError, match="is after"):
        plan(mode="window", requested_from=CLOCK + timedelta(days=1))
    with pytest.raises(WindowError, match="mode must be"):
        plan(mode="sometimes")


def test_backfill_runs_never_advance() -> None:
    assert not plan(may_advance_cursor=False).advances_cursor


def test_cursor_moves_forward_only() -> None:
    later = Window("incremental", None, CLOCK, SECONDS, True)
    earlier = Window("incremental", None, CLOCK - timedelta(days=1), SECONDS, True)
    assert next_cursor(None, later) == CLOCK
    assert next_cursor(CLOCK, earlier) == CLOCK
    assert next_cursor(CLOCK - timedelta(days=3), earlier) == CLOCK - timedelta(days=1)
    assert next_cursor(CLOCK - timedelta(days=3), Window("window", None, CLOCK, SECONDS, False)) == CLOCK - timedelta(days=3)


def test_window_round_trips_through_xcom_dict() -> None:
    window = plan(cursor_until=CLOCK - timedelta(days=1))
    window = Window(window.mode, window.from_, window.until, window.granularity, True, WindowFacts(metadata_prefix="lido"))
    assert Window.from_dict(window.to_dict()) == window


@pytest.mark.parametrize("text,expected", [
    ("2026-05-10", datetime(2026, 5, 10, tzinfo=timezone.utc)),
    ("2026-05-10T01:02:03Z", datetime(2026, 5, 10, 1, 2, 3, tzinfo=timezone.utc)),
    ("2026-05-10T03:02:03+02:00", datetime(2026, 5, 10, 1, 2, 3, tzinfo=timezone.utc)),
])
def test_parse_instant(text: str, expected: datetime) -> None:
    assert parse_instant(text) == expected
