"""``python -m include.simulators.oai_pmh``: a museum's OAI-PMH endpoint as a process.

Benchmarks and the demo start it like this (start-up line and shutdown: see
``include.simulators.cli``), then drive it through ``POST /_control/<action>``. Every
switch of `OaiFaults` is an option too (``--token-markup``, ``--list-size``, ...).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from datetime import timedelta

from ..cli import add_listen_arguments, serve_until_signalled, simulator_parser
from ..faults import add_fault_arguments, faults_from_arguments
from .collection import (
    DELETED_POLICIES,
    EARLIEST_DATESTAMPS,
    GRANULARITY_SECONDS,
    LIST_ORDERS,
    SPREADS,
    SimulatedRepository,
)
from .faults import OaiFaults
from .server import OaiSimulator


def _parser() -> argparse.ArgumentParser:
    parser = simulator_parser(__package__, "Simulated museum OAI-PMH 2.0 repository on loopback.")
    parser.add_argument("--records", type=int, default=1000)
    parser.add_argument("--deleted-fraction", type=float, default=0.05)
    parser.add_argument("--page-size", type=int, default=100)
    parser.add_argument("--granularity", choices=sorted(GRANULARITY_SECONDS), default="seconds")
    parser.add_argument("--formats", default="oai_dc,lido", help="comma-separated metadata prefixes")
    parser.add_argument("--deleted-record", choices=DELETED_POLICIES, default="persistent")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--invalid-every", type=int, default=0)
    parser.add_argument("--deleted-outside-sets", action="store_true",
                        help="deleted records belong to no set (set-restricted lists omit their tombstones)")
    parser.add_argument("--earliest-datestamp", choices=EARLIEST_DATESTAMPS, default="true",
                        help="what Identify announces: the truth, a time after half the records (late), "
                             "no element (absent), or the epoch")
    parser.add_argument("--spread", choices=SPREADS, default="uniform",
                        help="datestamps over the year: uniform, or clustered in a few bursts and a partial trickle")
    parser.add_argument("--list-order", choices=LIST_ORDERS, default="identifier",
                        help="the order lists return records in: by identifier, or by datestamp")
    parser.add_argument("--mutation-step", type=float, default=60.0, help="seconds per mutation call")
    add_listen_arguments(parser)
    add_fault_arguments(parser, OaiFaults)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    repo = SimulatedRepository(
        records=args.records, deleted_fraction=args.deleted_fraction, granularity=args.granularity,
        formats=tuple(f.strip() for f in args.formats.split(",") if f.strip()),
        deleted_record=args.deleted_record, page_size=args.page_size, seed=args.seed,
        invalid_every=args.invalid_every, mutation_step=timedelta(seconds=args.mutation_step),
        deleted_in_sets=not args.deleted_outside_sets, earliest_datestamp=args.earliest_datestamp,
        spread=args.spread, list_order=args.list_order,
    )
    faults = faults_from_arguments(args, OaiFaults)
    return serve_until_signalled(OaiSimulator(repo, host=args.host, port=args.port, faults=faults))


if __name__ == "__main__":
    raise SystemExit(main())
