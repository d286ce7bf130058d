"""Window planning: which slice of the partner's history a run harvests.

``until`` is frozen once from the partner's own clock and then reused by every retry;
``from`` is the previous ``until`` minus a lag, floored to the repository's granularity,
so changes indexed late at the edge of the last window are fetched again (upserts are
idempotent, so the overlap is harmless).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

MODES = ("incremental", "full", "window")
DAY = "day"
SECONDS = "seconds"


class WindowError(ValueError):
    """The requested window cannot be planned (bad Params, partner clock behind, ...)."""


def as_utc(value: datetime) -> datetime:
    if value.tzinfo is None:
        return value.replace(tzinfo=timezone.utc)
    return value.astimezone(timezone.utc)


def floor_to(value: datetime, granularity: str) -> datetime:
    value = as_utc(value).replace(microsecond=0)
    if granularity == DAY:
        return value.replace(hour=0, minute=0, second=0)
    return value


def parse_instant(text: str) -> datetime:
    """Parse ``YYYY-MM-DD`` or an ISO 8601 timestamp (``Z`` or offset) into UTC."""
    text = text.strip()
    if len(text) == 10:
        return datetime.strptime(text, "%Y-%m-%d").replace(tzinfo=timezone.utc)
    if text.endswith("Z"):
        text = text[:-1] + "+00:00"
    try:
        return as_utc(datetime.fromisoformat(text))
    except ValueError:
        raise WindowError(f"not a date or ISO 8601 timestamp: {text!r}") from None


def format_instant(value: datetime) -> str:
    return as_utc(value).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Window:
    """The frozen bounds of one run; serialisable to XCom as a plain dict."""

    mode: str
    from_: datetime | None
    until: datetime
    granularity: str
    advances_cursor: bool
    protocol: dict[str, Any] = field(default_factory=dict)  # adapter facts frozen with it

    @property
    def partner_clock(self) -> datetime | None:
        """The partner's own clock when the window was frozen (it may trail ``until``)."""
        text = self.protocol.get("partner_clock")
        return parse_instant(text) if text else None

    @property
    def is_full(self) -> bool:
        return self.from_ is None

    def to_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "from": format_instant(self.from_) if self.from_ else None,
            "until": format_instant(self.until),
            "granularity": self.granularity,
            "advances_cursor": self.advances_cursor,
            "protocol": dict(self.protocol),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Window":
        return cls(
            mode=data["mode"],
            from_=parse_instant(data["from"]) if data.get("from") else None,
            until=parse_instant(data["until"]),
            granularity=data["granularity"],
            advances_cursor=bool(data["advances_cursor"]),
            protocol=dict(data.get("protocol") or {}),
        )

    def describe(self) -> str:
        start = format_instant(self.from_) if self.from_ else "the beginning"
        kind = "requested" if self.mode == "window" else self.mode  # never "window window"
        return f"{kind} window from {start} until {format_instant(self.until)} ({self.granularity})"


def plan_window(
    *,
    mode: str,
    partner_clock: datetime,
    granularity: str,
    lag: timedelta,
    cursor_until: datetime | None,
    requested_from: datetime | None = None,
    requested_until: datetime | None = None,
    may_advance_cursor: bool = True,
) -> Window:
    """Decide the run's bounds; ``may_advance_cursor`` is False for backfills."""
    if mode not in MODES:
        raise WindowError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    if granularity not in (DAY, SECONDS):
        raise WindowError(f"granularity must be {DAY!r} or {SECONDS!r}, got {granularity!r}")
    clock = floor_to(partner_clock, granularity)
    if mode == "window":
        if requested_from is None:
            raise WindowError("mode 'window' needs the 'from' Param")
        until = floor_to(requested_until, granularity) if requested_until else clock
        start = floor_to(requested_from, granularity)
        if start > until:
            raise WindowError(f"'from' ({format_instant(start)}) is after 'until' ({format_instant(until)})")
        return Window("window", start, until, granularity, advances_cursor=False)
    if mode == "full":
        return Window("full", None, clock, granularity, advances_cursor=False)
    if cursor_until is None:
        return Window("incremental", None, clock, granularity, advances_cursor=may_advance_cursor)
    start = floor_to(as_utc(cursor_until) - lag, granularity)
    # A partner clock behind our cursor (clock reset, failover) must not give from > until:
    # harvest up to the cursor again rather than refuse or skip.
    until = max(clock, floor_to(cursor_until, granularity))
    return Window("incremental", min(start, until), until, granularity, advances_cursor=may_advance_cursor)


def next_cursor(current: datetime | None, window: Window) -> datetime | None:
    """The cursor after this window applied: forward only, and only for incremental runs."""
    if not window.advances_cursor:
        return current
    if current is None or window.until > as_utc(current):
        return window.until
    return current


def channel_window(window: Window, channel: str) -> Window | None:
    """The own (day-granular) window of a run's extra channel, e.g. Sierra's deletions."""
    plan = (window.protocol.get("channels") or {}).get(channel)
    if not plan:
        return None
    start = parse_instant(plan["from"]) if plan.get("from") else None
    return Window(window.mode, start, parse_instant(plan["until"]), DAY, window.advances_cursor, dict(plan))
