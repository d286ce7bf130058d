"""Benchmark: what the size estimate of an unsliced Sierra full load costs.

Before its export an unsliced full load probes the span of bib ids (``GET bibs?fields=id&
limit=1``: the lowest id, then doubling and bisection for the highest) so that `progress`,
the health page and the task log can show an expected total and a time left (Sierra's
``total`` counts only a page). For each catalogue size the simulator runs in its own
process; printed: the probes, their wall time, the estimate against the catalogue's real
span, and, as the baseline measured in the same run against the same simulator, the time of
one export block of 2,000 bibs: the estimate's cost in export blocks, and as a share of
the whole export (size / 2,000 blocks at that block's time).

    .venv/bin/python benchmarks/sierra_size_estimate.py [--sizes 100000,1000000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import time
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository first
from benchmarks import support  # noqa: E402

KEY, SECRET = "bench-key", "bench-secret"
BLOCK = 2000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="100000,1000000")
    parser.add_argument("--repeat", type=int, default=3, help="measurements of each, the median printed")
    args = parser.parse_args()

    from partner_harvest.factory import Endpoint, build_adapter
    from partner_harvest.registry import Partner
    from partner_harvest.sierra.export import expected_bibs
    from partner_harvest.sierra.harvester import SierraAdapter

    logging.basicConfig(level=logging.WARNING)
    partner = Partner(id="bench_sierra", protocol="sierra", conn_id="-", page_size=BLOCK,
                      options={"export": {"limit": BLOCK}})
    print(f"Sierra size estimate: simulator in its own process, {os.cpu_count()} CPUs, "
          f"median of {args.repeat}; baseline: one export block of {BLOCK} bibs from the same simulator")
    for size in (int(s) for s in args.sizes.split(",")):
        sim_args = ("--bibs", str(size), "--deleted-fraction", "0.05", "--client-key", KEY, "--client-secret", SECRET)
        with support.simulator("sierra", *sim_args) as url:
            support.control(url, "warm_export", {})
            adapter = build_adapter(partner, Endpoint(url, KEY, SECRET))
            assert isinstance(adapter, SierraAdapter)
            adapter.first_id_from(0)  # the token and the connection, outside the measurement
            estimates: list[int | None] = []
            block_times: list[float] = []
            seconds: list[float] = []
            load = os.getloadavg()[0]
            with mock.patch.object(adapter, "first_id_from", wraps=adapter.first_id_from) as probe:
                for _ in range(args.repeat):
                    probe.reset_mock()
                    began = time.perf_counter()
                    estimates.append(expected_bibs(adapter, BLOCK))
                    seconds.append(time.perf_counter() - began)
                count = probe.call_count
            for _ in range(args.repeat):
                began = time.perf_counter()
                block = adapter.client.export_block(0, BLOCK, {})
                block_times.append(time.perf_counter() - began)
            estimate_s, block_s = statistics.median(seconds), statistics.median(block_times)
            blocks = size / BLOCK
            print(f"\n{size:,} bibs (ids 1000001..{1000000 + size}): estimate {estimates[-1]:,} "
                  f"({'= the id span' if estimates[-1] == size else 'NOT the id span'}), {count} probes, "
                  f"{estimate_s * 1000:.0f} ms; one export block ({block.input_records if block else 0} ids in) "
                  f"{block_s * 1000:.0f} ms: the estimate costs {estimate_s / block_s:.2f} blocks, "
                  f"{estimate_s / (block_s * blocks):.2%} of the export's {blocks:,.0f} blocks; "
                  f"loadavg {load:.2f} before, {os.getloadavg()[0]:.2f} after")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
