"""Benchmark: how evenly a count-less, clustered repository is cut, before and after the sampled cut (oai/sampled_cut.py).

The OAI-PMH simulator in this process (loopback HTTP, ``--records`` records, 500 a page,
``--list-size omitted``, ``--spread clustered``, seeds ``--seeds``) is planned for a full
harvest of ``--slices`` slices twice: by main's planner (equal time ranges: ``slicing.plan``
without a sampler) and by the cut of what the first pages show (the adapter's plan). Printed
per seed and list order: the records each slice holds, the plan's requests, and the bound
that the biggest slice puts on a latency-bound run (one chain's pages over the biggest
slice's pages: the most a run of that many slices in parallel can gain over one chain).
The scheduler's own figures come from benchmarks/slice_pool.py.

    .venv/bin/python benchmarks/sampled_slices.py [--records 50000] [--slices 4] [--seeds 1,2,3,9]
"""

from __future__ import annotations

import argparse
import bisect
import math
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository first
from benchmarks import support  # noqa: E402,F401 (puts the repository on sys.path)

if TYPE_CHECKING:
    from partner_harvest.window import Slice

PAGE = 500


def held(pieces: Iterable[Slice], stamps: list[int]) -> list[int]:
    """How many of the (sorted) datestamps each piece's window holds."""
    out = []
    for p in pieces:
        low = 0 if p.from_ is None else bisect.bisect_left(stamps, int(p.from_.timestamp()))
        out.append(bisect.bisect_right(stamps, int(p.until.timestamp())) - low)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=50_000)
    parser.add_argument("--slices", type=int, default=4)
    parser.add_argument("--seeds", default="1,2,3,9")
    args = parser.parse_args()

    from include.simulators.oai_pmh import OaiSimulator, SimulatedRepository
    from partner_harvest.factory import Endpoint, build_adapter
    from partner_harvest.oai import slicing
    from partner_harvest.pipeline import RunRequest, freeze_window
    from partner_harvest.registry import SliceSettings
    from tests.support.partners import oai_partner

    settings = SliceSettings(threshold_records=1000, target_records=1000, max_slices=args.slices,
                             without_count=args.slices)
    print(f"Count-less clustered repository: {args.records:,} records, {PAGE} a page, {args.slices} slices")
    for order in ("identifier", "datestamp"):
        for seed in (int(s) for s in args.seeds.split(",")):
            repo = SimulatedRepository(records=args.records, page_size=PAGE, seed=seed, spread="clustered",
                                       list_order=order, deleted_fraction=0.05)
            stamps = sorted(repo._stamp)
            with OaiSimulator(repo, list_size="omitted") as sim:
                partner = oai_partner(slicing=settings.model_dump())
                adapter = build_adapter(partner, Endpoint(sim.base_url))
                window = freeze_window(adapter, partner.lag, None, RunRequest("full"))
                before = slicing.plan(window, settings, lambda *a: None)  # main's: equal time ranges
                sim.clear_requests()
                after = adapter.plan_slices(window, settings)
                asked = sum(1 for r in sim.requests if r.get("verb") == "ListIdentifiers")

            chain = math.ceil(args.records / PAGE)
            for label, pieces, requests in (("before", before, 0), ("after", after, asked)):
                sizes = held(pieces, stamps)
                bound = chain / max(math.ceil(n / PAGE) for n in sizes)
                print(f"  {order:>10} seed {seed}: {label:>6}: {' / '.join(f'{n:,}' for n in sizes)} "
                      f"(plan: {requests} ListIdentifiers requests); biggest slice {max(sizes) / (args.records / args.slices):.2f}x "
                      f"an even share; bound {bound:.2f}x one chain")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
