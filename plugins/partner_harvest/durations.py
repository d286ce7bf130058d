"""A duration as a person reads it (``335d 7h``, ``1h 30m``, ``11m 19s``, ``12s``) and writes it
(``600``, ``10m``, ``2h``, ``1d``: :data:`Duration`, the registry's and the protocols' options').

The one formatter of the project: the health page, ``partner-harvest status`` and
``progress``, the DAG docs and the task logs all call :func:`human`, so "how long" reads
the same everywhere (not ``0:11:19`` in one place and ``11 min`` in another). The store
returns ``timedelta`` values; text is made only here, at the edge.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Annotated, Any

from pydantic import BeforeValidator, WithJsonSchema

_UNITS = (("d", 86400), ("h", 3600), ("m", 60), ("s", 1))
_DURATION = re.compile(r"^\s*(\d+)\s*([smhd]?)\s*$")
_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def human(value: timedelta | float) -> str:
    """The two largest units, truncated to whole seconds; a zero second unit is left out.

    ``timedelta(days=335, hours=7, minutes=59)`` -> ``335d 7h``; ``timedelta(hours=1)`` ->
    ``1h``; ``timedelta(minutes=-5)`` -> ``-5m``; under a second -> ``0s``. A float or int
    counts seconds.
    """
    seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    sign, rest = ("-" if seconds <= -1 else ""), int(abs(seconds))
    parts: list[tuple[int, str]] = []
    for unit, size in _UNITS:
        count, rest = divmod(rest, size)
        if count or parts:
            parts.append((count, unit))
        if len(parts) == 2:
            break
    shown = [f"{count}{unit}" for index, (count, unit) in enumerate(parts) if count or index == 0]
    return sign + (" ".join(shown) or "0s")


def ago(value: timedelta) -> str:
    """How long ago: ``3s ago``, ``2m 5s ago`` (a negative age, a skewed clock, reads ``0s ago``)."""
    return f"{human(max(value, timedelta(0)))} ago"


# -- reading one (the registry's durations, a protocol's options) -----------------------

def parse_duration(value: Any) -> timedelta:
    """Accept ``600``, ``"600s"``, ``"10m"``, ``"2h"`` or ``"1d"``."""
    if isinstance(value, timedelta):
        return value
    if isinstance(value, bool):
        raise ValueError(f"not a duration: {value!r}")
    if isinstance(value, (int, float)) and value >= 0:
        return timedelta(seconds=value)
    match = _DURATION.match(str(value))
    if not match:
        raise ValueError(f"not a duration: {value!r} (use seconds or e.g. '10m', '2h', '1d')")
    return timedelta(seconds=int(match.group(1)) * _SECONDS[match.group(2)])


Duration = Annotated[
    timedelta,
    BeforeValidator(parse_duration),
    WithJsonSchema({
        "anyOf": [
            {"type": "integer", "minimum": 0, "description": "seconds"},
            {"type": "string", "pattern": r"^\s*\d+\s*[smhd]?\s*$", "description": "e.g. 600s, 10m, 2h, 1d"},
        ]
    }),
]
