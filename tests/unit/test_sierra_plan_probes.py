"""The Sierra plan's probes for the highest bib id (sierra/harvester.highest_id): exact one at
a time, within the tolerance asked and in fewer rounds when a round goes out at once."""

from __future__ import annotations

import bisect
from collections.abc import Callable
from typing import Any

import pytest

from partner_harvest.sierra.harvester import SierraAdapter
from partner_harvest.spread import Spread

IDS = list(range(1_000_001, 1_100_001, 3))  # every third number a bib


class Catalogue:
    """``first_id_from`` as the JSON API answers ``id=[start,]&limit=1``, counting requests."""

    def __init__(self) -> None:
        self.asked = 0

    def first_id_from(self, start: int) -> int | None:
        self.asked += 1
        at = bisect.bisect_left(IDS, start)
        return IDS[at] if at < len(IDS) else None


def highest(width: int, within: int) -> tuple[int, int, list[int]]:
    catalogue, rounds = Catalogue(), []

    def run(call: Callable[[Any], Any], items: list[Any]) -> list[Any]:
        rounds.append(len(items))
        return [call(item) for item in items]

    adapter = SierraAdapter.__new__(SierraAdapter)  # only first_id_from is asked
    adapter.first_id_from = catalogue.first_id_from  # type: ignore[method-assign]
    high, probes = SierraAdapter.highest_id(adapter, IDS[4_000], 12_500, Spread(width, run), within)
    return high, probes, rounds


@pytest.mark.parametrize("width, within", [(1, 0), (3, 0), (3, 195)])
def test_the_highest_id_is_found_within_what_was_asked(width: int, within: int) -> None:
    high, probes, rounds = highest(width, within)
    assert IDS[-1] - within <= high <= IDS[-1]
    one_at_a_time = highest(1, 0)[1]
    if width > 1:
        assert len(rounds) * 2 < one_at_a_time, (rounds, one_at_a_time)
