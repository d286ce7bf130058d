"""The simulated clock both partner models keep.

Time moves only when a test (or the control API) says so: an explicit
advance, or one step per mutation, so every change gets a fresh, distinct
timestamp. It is never the wall clock, which keeps incremental-harvest tests
deterministic.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def epoch_seconds(value: datetime) -> int:
    """Whole epoch seconds of `value`; a naive datetime counts as UTC."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return int(value.timestamp() // 1)


def iso_seconds(moment: datetime) -> str:
    """Second-precision UTC text, the form both partners' clocks are reported in."""
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


class SimulatedClock:
    """Base of a simulated data set: its clock and the lock that guards both.

    The one re-entrant ``lock`` covers the clock and the subclass's data, so a
    mutation and the timestamp it writes are atomic for concurrent readers.
    """

    def __init__(self, start_clock: datetime, mutation_step: timedelta) -> None:
        self.mutation_step = mutation_step
        self.lock = threading.RLock()
        self._clock = float(epoch_seconds(start_clock))

    @property
    def clock(self) -> datetime:
        """The simulated 'now' (UTC); only mutations and advance_clock move it."""
        return EPOCH + timedelta(seconds=self._clock)

    @property
    def clock_epoch(self) -> int:
        """The simulated 'now' in whole epoch seconds."""
        return int(self._clock // 1)

    def advance_clock(self, seconds: float | timedelta) -> datetime:
        """Move the simulated clock forward; returns the new clock."""
        delta = seconds.total_seconds() if isinstance(seconds, timedelta) else float(seconds)
        if delta < 0:
            raise ValueError("the simulated clock never goes backwards")
        with self.lock:
            self._clock += delta
            return self.clock

    def rewind_clock(self, seconds: float | timedelta) -> datetime:
        """Fault injection: the partner's clock jumps backwards (a reset, a failover)."""
        delta = seconds.total_seconds() if isinstance(seconds, timedelta) else float(seconds)
        with self.lock:
            self._clock -= abs(delta)
            return self.clock

    def _tick(self) -> int:
        """One mutation step forward (caller holds ``lock``); returns the new epoch second."""
        self._clock += self.mutation_step.total_seconds()
        return int(self._clock // 1)
