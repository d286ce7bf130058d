"""A plan's requests that do not depend on each other, sent as many at once as the pool allows.

Until a run's plan is written no other task of the run talks to the partner (the slices
wait for it), so the plan may use the partner's whole pool: each round of its probes goes
out at once (each request still paced by the host's politeness), one after the other when
the pool has one slot.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class Spread:
    """``width`` calls at once through ``run``, else one after the other."""

    width: int = 1
    run: Callable[[Callable[[Any], Any], list[Any]], list[Any]] | None = None

    def __call__(self, items: list[T], call: Callable[[T], R]) -> list[R]:
        if self.run is None or self.width < 2 or len(items) < 2:
            return [call(item) for item in items]
        return self.run(call, items)


in_turn = Spread()


@contextmanager
def pooled(width: int, name: str) -> Iterator[Spread]:
    """A Spread ``width`` wide on threads of its own (named ``name``), for one plan."""
    if width < 2:
        yield in_turn
        return
    with ThreadPoolExecutor(width, thread_name_prefix=name) as pool:
        yield Spread(width, lambda call, items: list(pool.map(call, items)))
