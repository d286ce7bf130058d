"""Benchmark: an IIIF Change Discovery full harvest at 200 ms per response.

The museum simulator (in this process, loopback) answers every request after ``--delay``
seconds; the adapter walks the stream (pages of 100) and fetches each object's Linked Art
description with ``options.iiif.description_concurrency`` = ``--concurrency`` (and as many
pool slots), then again with 1: the floor of one request at a time. The sink is a list
(no database): what is measured is the protocol's fetching. Prints records/s of each and
the ratio.

``--slices N`` instead compares the chain at ``--concurrency`` with a sliced full harvest
of the same stream: the plan's walk of the page chain, then N slices harvested at once (a
thread each, its own adapter, as each mapped task has), each fetching one description at a
time as a slice does, with pool_slots = ``--concurrency`` (so both send the partner at most
that many descriptions at once; N above it only queues). Prints the plan's share too.

    .venv/bin/python benchmarks/iiif_throughput.py [--objects 400] [--delay 0.2] [--concurrency 8]
    .venv/bin/python benchmarks/iiif_throughput.py --slices 4 --concurrency 4 --objects 800
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository first
from benchmarks import support  # noqa: E402,F401 (puts the repository on sys.path)
from include.simulators.iiif.museum import Museum
from include.simulators.iiif.server import IiifServer
from partner_harvest.factory import Endpoint, build_adapter
from partner_harvest.pipeline import slice_window
from partner_harvest.records import HarvestItem, HarvestStats
from partner_harvest.store.slices import slice_channel
from partner_harvest.window import Slice, Window, WindowFacts
from tests.support.iiif_harness import iiif_partner


class ListSink:
    """A staging sink that is no database (adapters.StagingSink): what is staged, in a list."""

    conn = run = attempt = None
    seq = 0

    def __init__(self) -> None:
        self.items: list[HarvestItem] = []

    def write_page(self, items: list[HarvestItem], checkpoint: int | None = None) -> None:
        self.items.extend(items)

    def reset(self) -> None:
        self.items.clear()


def harvest(sim: IiifServer, concurrency: int) -> tuple[int, float]:
    partner = iiif_partner(pool_slots=concurrency, iiif={"description_concurrency": concurrency})
    adapter = build_adapter(partner, Endpoint(sim.collection_url))
    started = time.perf_counter()
    clock = adapter.clock()
    window = Window("full", None, clock.now, clock.granularity, False, WindowFacts.model_validate(clock.protocol))
    sink, stats = ListSink(), HarvestStats()
    adapter.harvest(window, sink, stats)
    return stats.records, time.perf_counter() - started


def sliced(sim: IiifServer, objects: int, slices: int, pool_slots: int) -> tuple[int, float, float, int]:
    """The plan (its walk of the chain), then the slices at once: records, seconds, plan seconds, slices."""
    per_slice = max(1, -(-objects // slices))
    partner = iiif_partner(pool_slots=pool_slots, iiif={"description_concurrency": pool_slots},
                           slicing={"threshold_records": per_slice, "target_records": per_slice,
                                    "max_slices": slices})
    started = time.perf_counter()
    adapter = build_adapter(partner, Endpoint(sim.collection_url))
    clock = adapter.clock()
    window = Window("full", None, clock.now, clock.granularity, False, WindowFacts.model_validate(clock.protocol))
    planned = adapter.plan_slices(window, partner.slicing)
    plan_seconds = time.perf_counter() - started

    def one(numbered: tuple[int, Slice]) -> int:
        index, bounds = numbered
        worker = build_adapter(partner, Endpoint(sim.collection_url))
        stats = HarvestStats()
        worker.harvest(slice_window(window, bounds.model_copy(update={"channel": slice_channel(index)})), ListSink(),
                       stats)
        return stats.records

    with ThreadPoolExecutor(max_workers=min(slices, pool_slots)) as workers:  # the pool's slots
        records = sum(workers.map(one, enumerate(planned, start=1)))
    return records, time.perf_counter() - started, plan_seconds, len(planned)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--objects", type=int, default=400)
    parser.add_argument("--delay", type=float, default=0.2)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--slices", type=int, default=0, help="compare the chain with this many slices")
    args = parser.parse_args()
    museum = Museum(page_sizes=(100,))
    museum.create(args.objects)
    with IiifServer(museum) as sim:
        sim.delay = args.delay
        if args.slices > 1:
            records, chain_seconds = harvest(sim, args.concurrency)
            assert records == args.objects, records
            print(f"one chain, concurrency {args.concurrency}: {records} records in {chain_seconds:.1f} s = "
                  f"{records / chain_seconds:.1f} records/s ({args.delay * 1000:.0f} ms per response; "
                  f"load {os.getloadavg()[0]:.2f})")
            records, seconds, plan_seconds, count = sliced(sim, args.objects, args.slices, args.concurrency)
            assert records == args.objects and count == args.slices, (records, count)
            print(f"{count} slices, one description at a time each, pool_slots {args.concurrency}: {records} records "
                  f"in {seconds:.1f} s = {records / seconds:.1f} records/s, of which the plan's walk of the chain "
                  f"{plan_seconds:.1f} s (load {os.getloadavg()[0]:.2f})")
            print(f"ratio {count} slices / one chain (records/s): {chain_seconds / seconds:.2f}x")
            return
        figures = {}
        for concurrency in (args.concurrency, 1):
            records, seconds = harvest(sim, concurrency)
            assert records == args.objects, records
            figures[concurrency] = records / seconds
            print(f"concurrency {concurrency}: {records} records in {seconds:.1f} s = {records / seconds:.1f} "
                  f"records/s ({args.delay * 1000:.0f} ms per response; load {os.getloadavg()[0]:.2f})")
    print(f"ratio bounded concurrency {args.concurrency} / one at a time: "
          f"{figures[args.concurrency] / figures[1]:.2f}x")


if __name__ == "__main__":
    main()
