"""The one duration formatter (partner_harvest.durations): what every page, command, DAG doc
and task log prints for "how long"."""

from __future__ import annotations

from datetime import timedelta

import pytest

from partner_harvest import durations
from partner_harvest.durations import human


@pytest.mark.parametrize(("value", "text"), [
    (timedelta(days=335, hours=7, minutes=59, seconds=59), "335d 7h"),  # the two largest units, truncated
    (timedelta(days=9, hours=23, minutes=59), "9d 23h"),
    (timedelta(days=10), "10d"),  # a zero second unit is left out
    (timedelta(days=1), "1d"),
    (timedelta(days=1, seconds=59), "1d"),  # ...also when only smaller units follow
    (timedelta(hours=1, minutes=30), "1h 30m"),
    (timedelta(hours=3, seconds=5), "3h"),
    (timedelta(minutes=10), "10m"),
    (timedelta(seconds=679), "11m 19s"),
    (timedelta(seconds=12), "12s"),
    (timedelta(seconds=0.4), "0s"),
    (timedelta(0), "0s"),
    (timedelta(minutes=-5), "-5m"),
    (timedelta(days=-2, hours=-3), "-2d 3h"),
    (timedelta(seconds=-0.5), "0s"),
    (679.6, "11m 19s"),  # seconds as a number (a rate's estimate)
    (0, "0s"),
])
def test_human(value: timedelta | float, text: str) -> None:
    assert human(value) == text


def test_ago_never_reads_negative() -> None:
    assert durations.ago(timedelta(seconds=3)) == "3s ago"
    assert durations.ago(timedelta(minutes=2, seconds=5)) == "2m 5s ago"
    assert durations.ago(timedelta(seconds=-4)) == "0s ago"  # a clock skewed against the database's


def test_nothing_else_in_the_library_formats_a_duration() -> None:
    """There were four formatters (page, status, DAG docs, the progress rows of the
    store) and str(timedelta) in two more places. A hand-rolled one shows up as a unit
    table or as str() of a timedelta; only durations.py may hold either."""
    import re
    from pathlib import Path

    package = Path(durations.__file__).parent
    suspects = re.compile(r"divmod\([^)]*,\s*(86400|3600)\)|//\s*3600|\bstr\((progress\.)?time_left\)"
                          r"|\{timedelta\(seconds=")
    found = [f"{path.relative_to(package)}:{n}: {line.strip()}"
             for path in sorted(package.rglob("*.py")) if path.name != "durations.py"
             for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if suspects.search(line)]
    assert not found, "format durations with partner_harvest.durations.human:\n" + "\n".join(found)
