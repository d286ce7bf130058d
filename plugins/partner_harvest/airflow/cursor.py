"""The partner's cursors: Airflow Variables holding the last applied window's until.

Moved forward only (I1) by the run recipe (``run.move_cursors``), through the task's
outlets (airflow/outlets.py): a late-finishing older run can never rewind them.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from airflow.sdk import Variable

from partner_harvest.registry import cursor_key as registry_cursor_key
from partner_harvest.window import parse_instant


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


def write_cursor(partner_id: str, value: dict[str, str], channel: str | None = None) -> None:
    """Store registry.cursor_value's dict as the Variable's JSON."""
    Variable.set(cursor_key(partner_id, channel), value, serialize_json=True,
                 description=f"harvest cursor of partner {partner_id}")
