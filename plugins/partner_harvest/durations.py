"""A duration as a person reads it: ``335d 7h``, ``1h 30m``, ``11m 19s``, ``12s``.

The one formatter of the project: the health page, ``partner-harvest status`` and
``progress``, the DAG docs and the task logs all call :func:`human`, so "how long" reads
the same everywhere (not ``0:11:19`` in one place and ``11 min`` in another). The store
returns ``timedelta`` values; text is made only here, at the edge.
"""

from __future__ import annotations

from datetime import timedelta

_UNITS = (("d", 86400), ("h", 3600), ("m", 60), ("s", 1))


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
