"""The Sierra plan's probes for the highest bib id (sierra/harvester.highest_id): exact one at
a time, within the tolerance asked and in fewer rounds when a round goes out at once; and the
order the lanes take its id ranges in."""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from types import SimpleNamespace
from typing import Any

import pytest

from partner_harvest.pipeline import graded
from partner_harvest.sierra import harvester
from partner_harvest.sierra.harvester import SierraAdapter
from partner_harvest.spread import Spread
from partner_harvest.window import Slice
from tests.support.partners import partner_from_entry

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


def test_the_plan_asks_whether_the_catalogue_is_big_in_its_first_round_of_steps_up(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """After the lowest id, the probe that tells a catalogue worth cutting (an id
    ``threshold_records`` above the lowest) goes out with the first round of steps up, not
    in a round of its own: one response time less on the run's path."""
    catalogue, rounds = Catalogue(), []

    def run(call: Callable[[Any], Any], items: list[Any]) -> list[Any]:
        rounds.append(len(items))
        return [call(item) for item in items]

    @contextmanager
    def recorded(width: int, name: str) -> Iterator[Spread]:
        yield Spread(width, run)

    monkeypatch.setattr(harvester, "pooled", recorded)
    monkeypatch.setattr(harvester, "widen", lambda session, width: None)
    partner = partner_from_entry({"id": "lib", "protocol": "sierra", "conn_id": "-", "pool_slots": 4,
                                  "slicing": {"threshold_records": 12_500, "target_records": 12_500,
                                              "max_slices": 4}})
    adapter = SierraAdapter.__new__(SierraAdapter)
    adapter.partner, adapter.partner_id = partner, partner.id
    adapter.client = SimpleNamespace(session=None)  # type: ignore[assignment]
    adapter.first_id_from = catalogue.first_id_from  # type: ignore[method-assign]
    window = SimpleNamespace(until=datetime(2026, 1, 1, tzinfo=timezone.utc))
    pieces = SierraAdapter._id_slices(adapter, window, partner.slicing)  # type: ignore[arg-type]
    assert len(pieces) == 4 and pieces[0].lo == 0 and pieces[-1].hi is None
    alone = catalogue.asked - sum(rounds)  # probes sent outside a round, one after another
    assert alone == 1, f"{alone} probes alone before the rounds {rounds}"


def test_the_open_ended_id_range_is_taken_first_among_slices_of_its_size() -> None:
    """The last id range has no upper id: it holds what lies above the plan's highest id
    (up to ``threshold_records / 64`` more, and whatever was added since) and its export
    ends with one more request that finds nothing. Taken last among equal slices, its lane
    ended about a second after the others (a Sierra sliced full load, 200,000 bibs); taken
    first among them, the lanes that finish first absorb it."""
    until = datetime(2026, 1, 1, tzinfo=timezone.utc)
    pieces = [Slice(until=until, lo=0 if i == 0 else 1_000_000 + 10_000 * i,
                    hi=None if i == 19 else 1_000_000 + 10_000 * (i + 1) - 1, estimate=10_000) for i in range(20)]
    joined = graded(pieces, 4)
    singles = [s for s in joined if s.estimate == 10_000]
    assert [s.estimate for s in joined[:4]] == [30_000] * 4 and len(singles) == 8
    assert singles[0].hi is None, [(s.lo, s.hi) for s in singles]
