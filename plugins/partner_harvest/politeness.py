"""Politeness per endpoint host: a delay between requests and an adaptive back-off, shared.

Partners hosted together (one machine serving many repositories) must not be hammered
together, and the slices of one big run are separate tasks in separate processes, often on
separate workers. So the pacing state of a host lives where all of them see it: a row of
``host_pacing`` in the aggregation database (``store.pacing``). Before each request to the
host a process reserves the host's next slot with one short UPDATE ... RETURNING and sleeps
until its slot starts; the slot is as long as the larger of the partner's ``request_delay``
and the host's back-off.

The back-off grows when responses are slow (``options.politeness.slow_response``) or fail
(429, 5xx, timeouts, broken connections): doubled, at least ``backoff_step``, at most
``max_backoff``, at most once per gap however many slices saw the strain at once. Each
healthy response takes ``recovery`` of it away again: it recovers slowly.

It must not feed itself. What is no strain on the host does not count: an answer whose body
the protocol client reads as one record's failure (Sierra's 500/135 on a bib its exporter
cannot convert: :meth:`Pacer.excuse` inside :meth:`Pacer.judged_by_caller`),
and a pooled connection the server closed while it idled (the transport replaces it, and
its answer on the new connection is what counts). Otherwise a back-off longer than the
server's keep-alive timeout would make every request meet a closed connection, each one
counted as strain again.

Quiet nights stay cheap: a partner with ``request_delay`` 0 touches the database only once
a response of its own was slow or failed, and stops again when the host's back-off has
worn off. The transport calls :class:`Pacer` around every request on the wire (retries
and redirects included), so no protocol client carries any of this.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Annotated, Protocol
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt

log = logging.getLogger(__name__)

MAX_DELAY_MS = 60_000  # DigitalNZ's and OpenAIRE's per-source delays run 0-60,000 ms
STRAIN_STATUSES = frozenset({429, 500, 502, 503, 504})


class PolitenessOptions(BaseModel):
    """options.politeness: how the adaptive back-off of the partner's host reacts."""

    model_config = ConfigDict(extra="forbid", frozen=True, title="options.politeness")

    adaptive: StrictBool = Field(default=True, description=(
        "slow down when the host's responses are slow or fail (429, 5xx, timeouts), shared by every "
        "slice and task talking to the host; recover slowly"))
    slow_response: Annotated[float, Field(gt=0, strict=True, description=(
        "seconds to the response's headers above which a response counts as a strain on the host"))] = 10.0
    backoff_step: Annotated[StrictInt, Field(ge=1, le=MAX_DELAY_MS, description=(
        "milliseconds of back-off after the first strain; each further strain doubles it"))] = 500
    max_backoff: Annotated[StrictInt, Field(ge=0, le=MAX_DELAY_MS, description=(
        "the longest back-off in milliseconds between two requests to the host"))] = 30_000
    recovery: Annotated[float, Field(gt=0, le=1, strict=True, description=(
        "the share of the back-off each healthy response takes away (0.1: about 45 healthy responses "
        "from 30 s back to none)"))] = 0.1


def endpoint_host(url: str) -> str:
    """The pacing key: the host name, lowercased, without scheme or port.

    Repositories served by one machine under several ports or paths share it; a host named
    differently (an alias of the same address) is paced on its own.
    """
    return (urlsplit(url).hostname or "").lower()


@dataclass(frozen=True)
class Reservation:
    """A slot at the host: how long to wait for it, and the gap it keeps before the next."""

    wait: float  # seconds from now until the slot starts (0 when it already has)
    gap_ms: float  # the slot's length: max(request_delay, back-off)
    penalty_ms: float  # the host's back-off after this reservation


class PacingStore(Protocol):
    """Where the hosts' pacing state lives (``store.pacing.PgPacingStore``: PostgreSQL)."""

    def register(self, partner_id: str, host: str, delay_ms: int) -> None: ...

    def reserve(self, host: str, delay_ms: int, healthy: int, recovery: float) -> Reservation: ...

    def strain(self, host: str, step_ms: int, cap_ms: int) -> float: ...

    def close(self) -> None: ...


class Pacer:
    """One session's side of its host's pacing: called by the transport around each request.

    ``store`` is a factory, called on the first request that needs the database (never, on
    a quiet night of a partner without a delay). Thread-safe: the OAI-PMH client fetches
    the next page from a worker thread.
    """

    def __init__(self, partner_id: str, host: str, delay_ms: int, options: PolitenessOptions,
                 store: Callable[[], PacingStore], *, sleep: Callable[[float], None] = time.sleep):
        self.partner_id = partner_id
        self.host = host
        self.delay_ms = delay_ms
        self.options = options
        self._store_factory = store
        self._store: PacingStore | None = None
        self._sleep = sleep
        self._lock = threading.Lock()
        self._penalty_ms = 0.0  # the host's back-off as this session last saw it
        self._healthy = 0  # healthy responses not yet reported (folded into the next reservation)
        # Threads inside judged_by_caller(), and the strained answer each got there: recorded
        # when the block ends, unless the client excused it after reading its body.
        self._judging: set[int] = set()
        self._pending: dict[int, tuple[float, int]] = {}
        self.slept = 0.0  # seconds this session waited for its slots
        self.reservations = 0

    @property
    def engaged(self) -> bool:
        """Whether the next request reserves a slot (a database round trip)."""
        return self.delay_ms > 0 or self._penalty_ms > 0

    def _db(self) -> PacingStore:
        if self._store is None:
            self._store = self._store_factory()
            self._store.register(self.partner_id, self.host, self.delay_ms)
        return self._store

    def before(self) -> float:
        """Wait for this request's slot at the host; returns the seconds waited."""
        self._settle(threading.get_ident())  # a second request in a judged block: the first answer stands
        with self._lock:
            if not self.engaged:
                return 0.0
            healthy, self._healthy = self._healthy, 0
            slot = self._db().reserve(self.host, self.delay_ms, healthy, self.options.recovery)
            self._penalty_ms = slot.penalty_ms
            self.reservations += 1
        if slot.wait > 0:
            self._sleep(slot.wait)
            self.slept += slot.wait
        return max(slot.wait, 0.0)

    def after(self, seconds: float, status: int | None) -> None:
        """Report one response (``status`` None: no response, the request failed)."""
        strained = status is None or status in STRAIN_STATUSES or seconds > self.options.slow_response
        if not self.options.adaptive:
            return
        thread = threading.get_ident()
        with self._lock:
            if not strained:
                if self.engaged:
                    self._healthy += 1
                return
            if status is not None and thread in self._judging:
                self._pending[thread] = (seconds, status)
                return
            self._strain(seconds, status)

    @contextmanager
    def judged_by_caller(self) -> Iterator[None]:
        """A strained answer to a request made in this block (this thread) waits for the
        caller to read its body: recorded when the block ends, unless :meth:`excuse` came."""
        thread = threading.get_ident()
        with self._lock:
            self._judging.add(thread)
        try:
            yield
        finally:
            with self._lock:
                self._judging.discard(thread)
            self._settle(thread)

    def excuse(self) -> None:
        """The answer just read failed for one record, not for the host (Sierra's 500/135 on
        a bib its exporter cannot convert): not a strain."""
        with self._lock:
            self._pending.pop(threading.get_ident(), None)

    def _settle(self, thread: int) -> None:
        with self._lock:
            pending = self._pending.pop(thread, None)
            if pending is not None:
                self._strain(*pending)

    def _strain(self, seconds: float, status: int | None) -> None:
        """Record a strain on the host (the lock held)."""
        penalty = self._db().strain(self.host, self.options.backoff_step, self.options.max_backoff)
        if penalty > self._penalty_ms:
            log.warning("%s: host %s strained (%s after %.1f s); every request to it now waits at least "
                        "%.0f ms (options.politeness)", self.partner_id, self.host,
                        f"HTTP {status}" if status is not None else "no response", seconds, penalty)
        self._penalty_ms = penalty

    def close(self) -> None:
        with self._lock:
            if self._store is not None:
                self._store.close()
                self._store = None
