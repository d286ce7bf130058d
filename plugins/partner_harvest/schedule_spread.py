"""Spread many partners' nightly starts over a window, deterministically by partner id.

With every partner at ``0 2 * * *`` the scheduler queues them all at 02:00 and the
workers (and shared hosts) get the whole night's load in one minute. A registry
``schedule_window: "02:00-05:00"`` gives each partner one minute of the window instead,
picked from a hash of its id: the same minute on every parse and every machine (no
``hash()``, which Python salts per process), new partners spread without moving the old
ones, and the minutes fall evenly over the window.
"""

from __future__ import annotations

import hashlib

WINDOW_PATTERN = r"^([01][0-9]|2[0-3]):[0-5][0-9]-([01][0-9]|2[0-3]):[0-5][0-9]$"
DAY_MINUTES = 24 * 60


def window_minutes(window: str) -> tuple[int, int]:
    """``"HH:MM-HH:MM"`` as (first minute of the day, length in minutes); may pass midnight."""
    try:
        start_text, end_text = window.split("-")
        start = _minute(start_text)
        end = _minute(end_text)
    except ValueError:
        raise ValueError(f"must be HH:MM-HH:MM (UTC), e.g. 02:00-05:00, got {window!r}") from None
    length = (end - start) % DAY_MINUTES
    if length == 0:
        raise ValueError(f"{window!r} is empty: its start and end are the same minute")
    return start, length


def _minute(text: str) -> int:
    hours, minutes = text.split(":")
    value = int(hours) * 60 + int(minutes)
    if not (len(hours) == 2 and len(minutes) == 2 and 0 <= int(hours) < 24 and 0 <= int(minutes) < 60):
        raise ValueError(text)
    return value


def spread_minute(partner_id: str, window: str) -> int:
    """The minute of the day the partner starts: the window's start plus the id's share of it."""
    start, length = window_minutes(window)
    digest = hashlib.sha256(partner_id.encode("utf-8")).digest()
    return (start + int.from_bytes(digest[:8], "big") % length) % DAY_MINUTES


def spread_schedule(partner_id: str, window: str) -> str:
    """A daily cron (UTC) at the partner's minute of ``window`` (start included, end excluded)."""
    minute = spread_minute(partner_id, window)
    return f"{minute % 60} {minute // 60} * * *"
