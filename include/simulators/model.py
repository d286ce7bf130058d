"""Seeded mutations of a simulated data set, as partner staff would make them.

Both partner models (an OAI-PMH collection, a Sierra catalogue) edit and
delete the same way: a seeded pick of live items, or named ones, and each
batch is stamped with one tick of the simulated clock. A model supplies only
what an edit or a deletion means for its own storage.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Generic, TypeVar

from .clock import SimulatedClock

IdT = TypeVar("IdT")


class SimulatedModel(SimulatedClock, Generic[IdT]):
    """A mutable data set with a simulated clock; public mutations are thread-safe.

    Subclasses implement `_live_indices`, `_live_indices_for`, `_apply_edit`,
    `_apply_delete` and `add`; ``IdT`` is what callers may name an item by.
    """

    _noun = "items"  # in error messages: "asked for 5 items but only 3 are live"

    def __init__(self, start_clock: datetime, mutation_step: timedelta, mutation_seed: int) -> None:
        super().__init__(start_clock, mutation_step)
        self._mutation_rng = random.Random(mutation_seed)

    # ------------------------------------------------------ subclass storage
    def _live_indices(self) -> list[int]:
        """Storage indices of every live item, ascending."""
        raise NotImplementedError

    def _live_indices_for(self, ids: Iterable[IdT]) -> list[int]:
        """Sorted, distinct storage indices of `ids`; KeyError if unknown, ValueError if not live."""
        raise NotImplementedError

    def _apply_edit(self, indices: list[int]) -> list[str]:
        raise NotImplementedError

    def _apply_delete(self, indices: list[int]) -> list[str]:
        raise NotImplementedError

    def add(self, n: int) -> list[str]:
        raise NotImplementedError

    # ------------------------------------------------------------- mutations
    def _pick_live(self, n: int) -> list[int]:
        if n < 0:
            raise ValueError("n must be >= 0")
        live = self._live_indices()
        if n > len(live):
            raise ValueError(f"asked for {n} {self._noun} but only {len(live)} are live")
        return sorted(self._mutation_rng.sample(live, n))

    def edit(self, n: int) -> list[str]:
        """Edit n random live items (see `_apply_edit`); returns their ids."""
        with self.lock:
            return self._apply_edit(self._pick_live(n))

    def delete(self, n: int) -> list[str]:
        """Delete n random live items (see `_apply_delete`); returns their ids."""
        with self.lock:
            return self._apply_delete(self._pick_live(n))

    def edit_ids(self, ids: Iterable[IdT]) -> list[str]:
        """Edit these live items; returns their ids."""
        with self.lock:
            return self._apply_edit(self._live_indices_for(ids))

    def delete_ids(self, ids: Iterable[IdT]) -> list[str]:
        """Delete these live items; returns their ids."""
        with self.lock:
            return self._apply_delete(self._live_indices_for(ids))
