"""The Sierra id enumeration fetches its next page while the current one is copied.

``one_ahead`` runs the page iterator in a second thread, never more than one page ahead
of its consumer, and raises the iterator's errors at the page they belong to.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from partner_harvest.sierra.export import one_ahead


def test_the_next_page_is_fetched_while_the_current_one_is_used_and_never_more() -> None:
    used = 0
    fetching = [threading.Event() for _ in range(5)]

    def pages() -> Iterator[int]:
        for number in range(4):
            fetching[number].set()
            assert number <= used + 1, f"page {number} fetched while page {used} was still unused"
            yield number

    seen = []
    for page in one_ahead(pages(), "test"):
        if page < 3:  # the next page is under way before this one is done with
            assert fetching[page + 1].wait(10), f"page {page + 1} was not fetched ahead"
        seen.append(page)
        used += 1
    assert seen == [0, 1, 2, 3]


def test_an_error_of_the_iterator_is_raised_at_its_page() -> None:
    def pages() -> Iterator[int]:
        yield 1
        raise RuntimeError("rate limited")

    got = []
    with pytest.raises(RuntimeError, match="rate limited"):
        for page in one_ahead(pages(), "test"):
            got.append(page)
    assert got == [1]
