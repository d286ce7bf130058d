"""Slices in processes of their own, paced through the shared PostgreSQL state (tests, benchmarks).

Each slice is what a mapped ``harvest_changes`` does on the wire: an OAI-PMH ListRecords
chain over a datestamp range, through the partner's real adapter, transport and pacer. A
process runs its slices side by side in threads, each with its own session and its own
database connection, as separate tasks would; a test starts several processes.
"""

from __future__ import annotations

import multiprocessing
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from partner_harvest.factory import Endpoint, build_adapter
from partner_harvest.oai.harvester import OaiAdapter
from partner_harvest.registry import Partner
from partner_harvest.store.pacing import PgPacingStore

YEAR_END = datetime(2026, 1, 1, tzinfo=timezone.utc)  # the simulator's start clock: stamps lie in the year before


@dataclass(frozen=True)
class Slice:
    entry: dict[str, Any]  # the partner's registry entry
    base_url: str
    from_: str
    until: str


def slices(entry: dict[str, Any], base_url: str, count: int) -> list[Slice]:
    """``count`` equal datestamp ranges over the simulator's year of records."""
    start = YEAR_END - timedelta(days=366)
    step = (YEAR_END - start) / count
    stamp = "%Y-%m-%dT%H:%M:%SZ"
    return [Slice(entry, base_url, (start + i * step).strftime(stamp),
                  (start + (i + 1) * step - timedelta(seconds=1)).strftime(stamp)) for i in range(count)]


def harvest_slice(job: Slice, conninfo: str | None) -> dict[str, Any]:
    """One slice's chain; ``conninfo`` None: unpaced (the baseline)."""
    partner = Partner.model_validate(job.entry)
    pacing = (lambda: PgPacingStore(conninfo)) if conninfo else None
    adapter = build_adapter(partner, Endpoint(job.base_url), pacing=pacing)
    assert isinstance(adapter, OaiAdapter)
    records = pages = 0
    started = time.monotonic()
    with closing(adapter.client.list_pages("ListRecords", metadata_prefix="oai_dc", set_spec=None,
                                           from_=job.from_, until=job.until)) as chain:
        for page in chain:
            pages += 1
            records += len(page.items)
    adapter.client.session.close()
    return {"partner": partner.id, "pages": pages, "records": records, "seconds": time.monotonic() - started}


def _process(jobs: list[Slice], conninfo: str | None) -> list[dict[str, Any]]:
    with ThreadPoolExecutor(len(jobs)) as pool:
        return list(pool.map(lambda job: harvest_slice(job, conninfo), jobs))


def run_in_processes(groups: list[list[Slice]], conninfo: str | None) -> list[dict[str, Any]]:
    """Each group of slices in a process of its own, each opening its own sessions and
    database connections, so nothing is shared but the database. Spawned, not forked: a
    forked child hung the suite once under load (most likely forked while a simulator thread
    held a lock), and the pool's terminate then waited on it for good."""
    context = multiprocessing.get_context("spawn")
    with context.Pool(len(groups)) as pool:
        results = pool.starmap(_process, [(group, conninfo) for group in groups])
    return [r for group in results for r in group]


def most_in_any_second(arrivals: list[float]) -> int:
    """The most arrivals inside any one-second span (a sliding window over sorted times)."""
    times = sorted(arrivals)
    most, first = 0, 0
    for last, at in enumerate(times):
        while at - times[first] >= 1.0:
            first += 1
        most = max(most, last - first + 1)
    return most
