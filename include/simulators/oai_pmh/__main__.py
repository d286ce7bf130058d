"""Run the simulator as a process, for benchmarks and the demo.

Prints exactly one line, ``listening on <base_url>``, then serves until
SIGTERM or SIGINT. Drive it through ``POST /_control/<action>``.
"""

from __future__ import annotations

import argparse
import signal
import threading
from collections.abc import Sequence
from datetime import timedelta

from .collection import DELETED_POLICIES, GRANULARITY_SECONDS, SimulatedRepository
from .server import OaiSimulator


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m include.simulators.oai_pmh",
                                     description="Simulated museum OAI-PMH 2.0 repository on loopback.")
    parser.add_argument("--records", type=int, default=1000)
    parser.add_argument("--deleted-fraction", type=float, default=0.05)
    parser.add_argument("--page-size", type=int, default=100)
    parser.add_argument("--granularity", choices=sorted(GRANULARITY_SECONDS), default="seconds")
    parser.add_argument("--formats", default="oai_dc,lido", help="comma-separated metadata prefixes")
    parser.add_argument("--deleted-record", choices=DELETED_POLICIES, default="persistent")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--invalid-every", type=int, default=0)
    parser.add_argument("--mutation-step", type=float, default=60.0, help="seconds per mutation call")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    repo = SimulatedRepository(
        records=args.records, deleted_fraction=args.deleted_fraction, granularity=args.granularity,
        formats=tuple(f.strip() for f in args.formats.split(",") if f.strip()),
        deleted_record=args.deleted_record, page_size=args.page_size, seed=args.seed,
        invalid_every=args.invalid_every, mutation_step=timedelta(seconds=args.mutation_step),
    )
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    with OaiSimulator(repo, host=args.host, port=args.port) as sim:
        print(f"listening on {sim.base_url}", flush=True)
        while not stop.wait(0.2):
            pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
