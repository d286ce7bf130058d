"""The partner's cursor: an Airflow Variable holding the last applied window's until.

Moves forward only (I1): a late-finishing older run can never rewind it.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from airflow.sdk import Variable

from partner_harvest.registry import cursor_key as registry_cursor_key
from partner_harvest.registry import cursor_value
from partner_harvest.window import Window, format_instant, next_cursor, parse_instant

log = logging.getLogger(__name__)


def cursor_key(partner_id: str, channel: str | None = None) -> str:
    """The Variable's name; unique per partner and channel (see registry.cursor_key)."""
    return registry_cursor_key(partner_id, channel)


def read_cursor(partner_id: str, channel: str | None = None) -> datetime | None:
    value: Any = Variable.get(cursor_key(partner_id, channel), default=None, deserialize_json=True)
    if not value:
        return None
    if isinstance(value, dict) and value.get("until"):
        return parse_instant(str(value["until"]))
    if isinstance(value, str):
        return parse_instant(value)
    raise ValueError(f"Variable {cursor_key(partner_id, channel)} holds {value!r}; expected {{'until': ...}}")


def advance_cursor(partner_id: str, window: Window, run_id: str, channel: str | None = None) -> dict[str, Any]:
    """Write ``window.until`` when it is later than the stored cursor; report what happened."""
    key = cursor_key(partner_id, channel)
    current = read_cursor(partner_id, channel)
    target = next_cursor(current, window)
    if not window.advances_cursor:
        log.info("%s: %s run leaves %s where it is (%s)", partner_id, window.mode, key,
                 format_instant(current) if current else "unset")
        return {"key": key, "moved": False, "cursor": format_instant(current) if current else None,
                "reason": f"{window.mode} runs never move the cursor"}
    if target is None or target == current:
        shown = format_instant(current) if current else None
        log.info("%s: %s already at %s; not moving it backwards to %s", partner_id, key,
                 shown or "unset", format_instant(window.until))
        return {"key": key, "moved": False, "cursor": shown, "reason": "never backwards"}
    value = cursor_value(target, window.granularity, run_id)
    Variable.set(key, value, serialize_json=True, description=f"harvest cursor of partner {partner_id}")
    log.info("%s: %s moved from %s to %s", partner_id, key,
             format_instant(current) if current else "unset", value["until"])
    return {"key": key, "moved": True, "cursor": value["until"], "previous": format_instant(current) if current else None}
