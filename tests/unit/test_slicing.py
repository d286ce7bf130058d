"""Cutting an OAI-PMH window into datestamp slices (oai/slicing.py) against a counting probe."""

from __future__ import annotations

import bisect
import random
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone

from partner_harvest.oai.slicing import plan, plan_by_sets
from partner_harvest.registry import SliceSettings
from partner_harvest.window import Slice, Window, WindowFacts, format_instant
from tests.support.checks import present

T0 = datetime(2020, 1, 1, tzinfo=timezone.utc)
UNTIL = datetime(2026, 1, 1, tzinfo=timezone.utc)


def full_window(granularity: str = "YYYY-MM-DDThh:mm:ssZ") -> Window:
    return Window("full", None, UNTIL, "seconds" if "hh" in granularity else "day", False,
                  WindowFacts(oai_granularity=granularity, earliest_datestamp=format_instant(T0)))


class Counter:
    """A repository's counts over sorted datestamps, like completeListSize."""

    def __init__(self, stamps: list[datetime], honest: bool = True) -> None:
        self.stamps = sorted(stamps)
        self.honest = honest
        self.calls = 0

    def __call__(self, from_: datetime | None, until: datetime) -> int | None:
        self.calls += 1
        if not self.honest:
            return None
        lo = 0 if from_ is None else bisect.bisect_left(self.stamps, from_)
        return bisect.bisect_right(self.stamps, until) - lo

    def inside(self, from_: datetime | None, until: datetime) -> int:
        counted = self(from_, until)
        assert counted is not None
        return counted


def covers(pieces: Sequence[Slice], window: Window, step: timedelta) -> None:
    assert pieces[0].from_ == window.from_ and pieces[-1].until == window.until
    for a, b in zip(pieces, pieces[1:]):
        # no gap: each starts where the one before ends, the boundary granule in both (a
        # partner comparing sub-second stamps raw returns a record at until + 0.5 s only there)
        assert b.from_ is not None and b.from_ == a.until and b.until >= b.from_ + step


def test_similar_slices_cover_the_window_with_few_probes() -> None:
    rng = random.Random(4)
    stamps = [T0 + timedelta(seconds=rng.randrange(int((UNTIL - T0).total_seconds()))) for _ in range(10_000)]
    counter = Counter(stamps)
    pieces = plan(full_window(), SliceSettings(threshold_records=2_000, target_records=1_500, max_slices=16), counter)
    covers(pieces, full_window(), timedelta(seconds=1))
    sizes = [counter.inside(p.from_, p.until) for p in pieces]
    assert sum(sizes) == 10_000 and max(sizes) <= 1_500 and len(pieces) <= 16
    assert counter.calls <= 2 * len(pieces) + 1


def test_a_burst_on_one_day_stays_one_slice_at_day_granularity() -> None:
    burst = [datetime(2024, 5, 5, tzinfo=timezone.utc)] * 5_000
    spread = [T0 + timedelta(days=d) for d in range(0, 2000, 2)]
    counter = Counter(burst + spread)
    window = full_window("YYYY-MM-DD")
    pieces = plan(window, SliceSettings(threshold_records=1_000, target_records=500, max_slices=32), counter)
    covers(pieces, window, timedelta(days=1))
    twice = sum(counter.inside(p.from_, present(p.from_)) for p in pieces[1:])  # each boundary day is in two slices
    assert sum(counter.inside(p.from_, p.until) for p in pieces) - twice == 6_000
    assert max(counter.inside(p.from_, p.until) for p in pieces) >= 5_000  # cannot cut below a day


def test_without_a_count_a_full_harvest_uses_equal_time_ranges_only_when_asked() -> None:
    counter = Counter([], honest=False)
    assert plan(full_window(), SliceSettings(), counter) == []
    pieces = plan(full_window(), SliceSettings(without_count=4), counter)
    assert len(pieces) == 4
    covers(pieces, full_window(), timedelta(seconds=1))


def test_a_short_incremental_window_is_never_probed() -> None:
    counter = Counter([T0])
    window = Window("incremental", UNTIL - timedelta(days=1), UNTIL, "seconds", True,
                    WindowFacts(oai_granularity="YYYY-MM-DDThh:mm:ssZ"))
    assert plan(window, SliceSettings(), counter) == [] and counter.calls == 0


# -- slicing.sets -------------------------------------------------------------------------

SETS = ("a", "b", "c")


class SetCounter:
    """completeListSize per set over the whole window; ``whole`` is the unrestricted list's."""

    def __init__(self, per_set: dict[str, int | None], whole: int | None) -> None:
        self.per_set, self.whole = per_set, whole
        self.asked: list[str | None] = []

    def __call__(self, from_: datetime | None, until: datetime, set_spec: str | None = None) -> int | None:
        self.asked.append(set_spec)
        return self.whole if set_spec is None else self.per_set[set_spec]


def test_sets_that_add_up_to_the_whole_list_are_the_slices() -> None:
    counter = SetCounter({"a": 3_000, "b": 0, "c": 5_000}, whole=8_000)
    pieces = plan_by_sets(full_window(), SliceSettings(threshold_records=6_000, target_records=6_000, sets=SETS), counter)
    assert pieces == [Slice(until=UNTIL, estimate=3_000, set_spec="a"),
                      Slice(until=UNTIL, estimate=5_000, set_spec="c")]  # an empty set: no slice
    assert counter.asked == [None, "a", "b", "c"]


def test_sets_are_not_trusted_unless_their_counts_make_the_whole_list() -> None:
    settings = SliceSettings(threshold_records=6_000, target_records=6_000, sets=SETS)
    cases: list[tuple[dict[str, int | None], int | None]] = [
                          ({"a": 3_000, "b": 1_000, "c": 3_000}, 8_000),   # a record in no set
                           ({"a": 3_000, "b": 2_000, "c": 4_000}, 8_000),   # a record in two
                           ({"a": 3_000, "b": None, "c": 5_000}, 8_000),    # a set without a count
                           ({"a": 3_000, "b": 0, "c": 5_000}, None),        # no count for the whole list
                           ({"a": 8_000, "b": 0, "c": 0}, 8_000)]          # one set holds everything
    for per_set, whole in cases:
        assert plan_by_sets(full_window(), settings, SetCounter(per_set, whole)) is None, per_set


def test_a_small_list_or_a_short_window_stays_whole_whatever_the_sets() -> None:
    counter = SetCounter({"a": 500, "b": 500, "c": 500}, whole=1_500)
    assert plan_by_sets(full_window(), SliceSettings(threshold_records=6_000, target_records=6_000, sets=SETS), counter) == []
    assert counter.asked == [None]  # the sets are not even counted
    short = Window("incremental", UNTIL - timedelta(days=1), UNTIL, "seconds", True,
                   WindowFacts(oai_granularity="YYYY-MM-DDThh:mm:ssZ"))
    counter = SetCounter({"a": 1, "b": 1, "c": 1}, whole=3)
    assert plan_by_sets(short, SliceSettings(sets=SETS), counter) == [] and counter.asked == []
    assert plan_by_sets(full_window(), SliceSettings(), counter) is None  # no sets listed: by datestamp


class SetStamps:
    """completeListSize of any range of the whole list or of one set, from each set's datestamps."""

    def __init__(self, per_set: dict[str, list[datetime]]) -> None:
        self.per_set = {spec: Counter(stamps) for spec, stamps in per_set.items()}
        self.whole = Counter([s for stamps in per_set.values() for s in stamps])

    def __call__(self, from_: datetime | None, until: datetime, set_spec: str | None = None) -> int | None:
        return (self.whole if set_spec is None else self.per_set[set_spec])(from_, until)


def spread(n: int, seed: int) -> list[datetime]:
    rng = random.Random(seed)
    return [T0 + timedelta(seconds=rng.randrange(int((UNTIL - T0).total_seconds()))) for _ in range(n)]


def test_a_set_bigger_than_the_target_is_cut_in_time_within_its_set() -> None:
    """A big set is not one slice that is expensive to redo: it is bisected in time with its
    own counts, and its pieces cover the window; a small set stays whole, an empty one gets none."""
    counter = SetStamps({"a": spread(6_000, 1), "b": spread(1_000, 2), "c": []})
    settings = SliceSettings(threshold_records=2_000, target_records=1_500, max_slices=16, sets=SETS)
    pieces = present(plan_by_sets(full_window(), settings, counter))
    by_set = {spec: [p for p in pieces if p.set_spec == spec] for spec in SETS}
    assert len(by_set["a"]) >= 4 and len(by_set["b"]) == 1 and by_set["c"] == []
    for spec in ("a", "b"):
        covers(by_set[spec], full_window(), timedelta(seconds=1))  # disjoint in time, no gap, within the set
        sizes = [present(counter(p.from_, p.until, spec)) for p in by_set[spec]]
        assert sum(sizes) == counter(None, UNTIL, spec) and max(sizes) <= 1_500
        assert [p.estimate for p in by_set[spec]] == sizes  # the estimates are the set's own counts


NO_EARLIEST = Window("full", None, UNTIL, "seconds", False, WindowFacts(oai_granularity="YYYY-MM-DDThh:mm:ssZ"))


def test_cutting_sets_stops_at_max_slices_with_or_without_an_earliest_datestamp() -> None:
    counter = SetStamps({"a": spread(6_000, 3), "b": spread(5_000, 4), "c": []})
    settings = SliceSettings(threshold_records=2_000, target_records=1_000, max_slices=4, sets=SETS)
    for window in (full_window(), NO_EARLIEST):  # without one, bisected from 1970: the empty halves cost no slice
        pieces = present(plan_by_sets(window, settings, counter))
        assert [p.set_spec for p in pieces] == ["a", "a", "b", "b"]  # the biggest range is halved first
        for spec, size in (("a", 6_000), ("b", 5_000)):
            own = [p for p in pieces if p.set_spec == spec]
            covers(own, window, timedelta(seconds=1))
            assert sum(present(counter(p.from_, p.until, spec)) for p in own) == size


def test_without_an_earliest_datestamp_the_cut_starts_at_the_epoch() -> None:
    """A repository that announces no usable earliestDatestamp (or 1970) is still cut into
    similar slices: the empty halves before its first record are dropped, not counted."""
    counter = Counter(spread(10_000, 5))
    settings = SliceSettings(threshold_records=2_000, target_records=1_500, max_slices=16)
    pieces = plan(NO_EARLIEST, settings, counter)
    covers(pieces, NO_EARLIEST, timedelta(seconds=1))
    sizes = [counter.inside(p.from_, p.until) for p in pieces]
    assert sum(sizes) == 10_000 and max(sizes) <= 1_500 and 7 <= len(pieces) <= 16  # 7: 10,000 / 1,500
    assert counter.calls <= 64 + 1  # the probe cap, whatever the counts
