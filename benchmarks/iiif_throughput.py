"""Benchmark: an IIIF Change Discovery full harvest at 200 ms per response.

The museum simulator (in this process, loopback) answers every request after ``--delay``
seconds; the adapter walks the stream (pages of 100) and fetches each object's Linked Art
description with ``options.iiif.description_concurrency`` = ``--concurrency`` (and as many
pool slots), then again with 1: the floor of one request at a time. The sink is a list
(no database): what is measured is the protocol's fetching. Prints records/s of each and
the ratio.

    .venv/bin/python benchmarks/iiif_throughput.py [--objects 400] [--delay 0.2] [--concurrency 8]
"""

from __future__ import annotations

import argparse
import os
import time

import support  # noqa: F401  (puts the worktree first on sys.path)

from include.simulators.iiif.museum import Museum
from include.simulators.iiif.server import IiifServer
from partner_harvest.factory import Endpoint, build_adapter
from partner_harvest.records import HarvestItem, HarvestStats
from partner_harvest.window import Window, WindowFacts
from tests.support.iiif_harness import iiif_partner


class ListSink:
    def __init__(self) -> None:
        self.items: list[HarvestItem] = []

    def write_page(self, items: list[HarvestItem]) -> None:
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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--objects", type=int, default=400)
    parser.add_argument("--delay", type=float, default=0.2)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    museum = Museum(page_sizes=(100,))
    museum.create(args.objects)
    with IiifServer(museum) as sim:
        sim.delay = args.delay
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
