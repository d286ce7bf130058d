"""Stand-alone Sierra REST API simulator process, for benchmarks and the demo.

Its options mirror `SimulatedCatalogue`, `SierraSimulator` and every switch of
`SierraFaults`. What it prints and how it stops is common to all simulators
(``include.simulators.cli``).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from datetime import timedelta

from ..cli import add_listen_arguments, serve_until_signalled, simulator_parser
from ..faults import add_fault_arguments, faults_from_arguments
from .catalogue import SimulatedCatalogue
from .faults import SierraFaults
from .server import SierraSimulator


def _parser() -> argparse.ArgumentParser:
    parser = simulator_parser(__package__, "Simulated Sierra ILS REST API (v6) on loopback.")
    parser.add_argument("--bibs", type=int, default=1000)
    parser.add_argument("--deleted-fraction", type=float, default=0.02)
    parser.add_argument("--suppressed-fraction", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--first-id", type=int, default=1_000_001)
    parser.add_argument("--oversized-every", type=int, default=0)
    parser.add_argument("--invalid-every", type=int, default=0)
    parser.add_argument("--mutation-step", type=float, default=60.0, help="seconds per mutation call")
    parser.add_argument("--token-lifetime", type=int, default=3600)
    parser.add_argument("--client-key", default="demo-key")
    parser.add_argument("--client-secret", default="demo-secret")
    parser.add_argument("--marc8-every", type=int, default=0, help="every n-th bib is MARC-8 in the export")
    parser.add_argument("--no-005-every", type=int, default=0)
    parser.add_argument("--no-id-every", type=int, default=0, help="every n-th bib lacks 001 and 907")
    parser.add_argument("--bad-utf8-every", type=int, default=0)
    parser.add_argument("--poison-every", type=int, default=0,
                        help="every n-th bib makes a bibs/marc block holding it answer 500/135")
    parser.add_argument("--keep-alive-timeout", type=float, default=5.0,
                        help="seconds an idle keep-alive connection stays open (0: never closed)")
    add_listen_arguments(parser)
    add_fault_arguments(parser, SierraFaults)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    catalogue = SimulatedCatalogue(
        bibs=args.bibs, deleted_fraction=args.deleted_fraction, seed=args.seed, first_id=args.first_id,
        suppressed_fraction=args.suppressed_fraction, oversized_every=args.oversized_every,
        invalid_every=args.invalid_every, mutation_step=timedelta(seconds=args.mutation_step),
        marc8_every=args.marc8_every, no_005_every=args.no_005_every, no_id_every=args.no_id_every,
        bad_utf8_every=args.bad_utf8_every, poison_every=args.poison_every,
    )
    sim = SierraSimulator(catalogue, host=args.host, port=args.port, client_key=args.client_key,
                          client_secret=args.client_secret, token_lifetime=args.token_lifetime,
                          keep_alive_timeout=args.keep_alive_timeout or None,
                          faults=faults_from_arguments(args, SierraFaults))
    return serve_until_signalled(sim)


if __name__ == "__main__":
    raise SystemExit(main())
