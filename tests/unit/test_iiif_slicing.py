"""Where the slice plan of an IIIF stream may cut its page chain (iiif/slicing.cut)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from partner_harvest.iiif.slicing import ChainPage, cut

T0 = datetime(2026, 1, 5, tzinfo=timezone.utc)


def page(index: int, newest: int, oldest: int, counted: int = 10, untimed: bool = False) -> ChainPage:
    """A chain page (newest first) whose activities span [oldest, newest] seconds after T0."""
    return ChainPage(f"p{index}", counted, T0 + timedelta(seconds=newest), T0 + timedelta(seconds=oldest), untimed)


def test_cuts_balance_the_activities_over_strict_boundaries() -> None:
    chain = [page(i, 100 - 10 * i, 91 - 10 * i) for i in range(8)]
    assert cut(chain, 4) == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert cut(chain, 1) == [] and cut(chain[:1], 4) == []


def test_no_cut_between_pages_sharing_an_instant() -> None:
    # page 1's oldest activity and page 2's newest share one instant: the cut moves to a neighbour
    chain = [page(0, 100, 91), page(1, 90, 80), page(2, 80, 71), page(3, 70, 61)]
    assert cut(chain, 2) in ([(0, 0), (1, 3)], [(0, 2), (3, 3)])
    assert all(lo != 2 for lo, _ in cut(chain, 2))
    # one instant over the whole chain: nowhere to cut
    assert cut([page(i, 50, 50) for i in range(4)], 2) == []


def test_an_activity_without_a_time_keeps_the_stream_whole() -> None:
    chain = [page(i, 100 - 10 * i, 91 - 10 * i) for i in range(4)]
    chain[2] = page(2, 80, 71, untimed=True)
    assert cut(chain, 2) == []
