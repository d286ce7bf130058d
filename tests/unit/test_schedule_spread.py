"""Each partner's start spread over its registry window, deterministically by id."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from datetime import datetime, timezone

import pytest
from croniter import croniter

from partner_harvest.registry import RegistryError, parse_registry
from partner_harvest.schedule_spread import spread_minute, spread_schedule, window_minutes


def test_the_same_id_gets_the_same_minute_in_another_process() -> None:
    """No salted hash(): a dag-processor and a worker (other processes) agree on the schedule."""
    here = [spread_schedule(f"partner_{n}", "02:00-05:00") for n in range(20)]
    code = ("from partner_harvest.schedule_spread import spread_schedule as s;"
            "print([s(f'partner_{n}', '02:00-05:00') for n in range(20)])")
    there = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert there.strip() == repr(here)


def test_a_thousand_ids_fall_in_the_window_roughly_evenly() -> None:
    minutes = [spread_minute(f"museum_{n}", "02:00-05:00") for n in range(1000)]
    assert all(120 <= m < 300 for m in minutes)
    # Six half-hours of ~167 each; a uniform spread keeps every one well inside 120..215.
    halves = Counter((m - 120) // 30 for m in minutes)
    assert sorted(halves) == list(range(6))
    assert all(120 <= n <= 215 for n in halves.values()), halves
    assert len(set(minutes)) > 150  # of the 180 minutes, nearly all are used
    assert max(Counter(minutes).values()) <= 15  # no minute gets a pile (expected ~5.6)


def test_every_spread_schedule_is_valid_cron_firing_once_a_day_in_the_window() -> None:
    base = datetime(2026, 3, 1, tzinfo=timezone.utc)
    for n in range(200):
        cron = spread_schedule(f"lib_{n}", "23:30-01:15")  # across midnight
        assert croniter.is_valid(cron)
        fires = croniter(cron, base)
        first, second = fires.get_next(datetime), fires.get_next(datetime)
        assert (second - first).total_seconds() == 86400
        minute = first.hour * 60 + first.minute
        assert minute >= 23 * 60 + 30 or minute < 75


@pytest.mark.parametrize("window", ["02:00-02:00", "2:00-05:00", "02:00-24:00", "02:00", "02:60-03:00"])
def test_a_bad_window_is_refused(window: str) -> None:
    with pytest.raises(ValueError):
        window_minutes(window)
        spread_schedule("x", window)


def _entry(**fields: object) -> dict[str, object]:
    return {"id": "museum_7", "protocol": "oai-pmh", "conn_id": "c", **fields}


def test_the_registry_schedule_is_the_spread_one() -> None:
    (partner,) = parse_registry({"partners": [_entry(schedule_window="02:00-05:00")]}).partners
    assert partner.schedule == spread_schedule("museum_7", "02:00-05:00")
    assert partner.schedule_window == "02:00-05:00"
    (plain,) = parse_registry({"partners": [_entry()]}).partners
    assert plain.schedule == "0 2 * * *"  # no window: the default is unchanged
    copy = partner.evolve(lag="20m")  # a copy carries the spread schedule with its window
    assert copy.schedule == partner.schedule and copy.lag.total_seconds() == 1200


def test_finish_by_counts_from_the_spread_start() -> None:
    (partner,) = parse_registry({"partners": [_entry(schedule_window="02:00-03:00", finish_by="06:00")]}).partners
    minute = spread_minute("museum_7", "02:00-03:00")
    assert partner.finish_by_offset is not None
    assert partner.finish_by_offset.total_seconds() == (360 - minute) * 60


@pytest.mark.parametrize("fields, problem", [
    ({"schedule_window": "02:00-05:00", "schedule": "0 3 * * *"}, "not both"),
    ({"schedule_window": "05:00-05:00"}, "empty"),
    ({"schedule_window": "2-5"}, "schedule_window"),
])
def test_the_registry_names_a_bad_window(fields: dict[str, object], problem: str) -> None:
    registry = parse_registry({"partners": [_entry(**fields)]})
    assert not registry.partners
    (error,) = registry.errors
    assert isinstance(error, RegistryError) and problem in str(error) and "museum_7" in str(error)
