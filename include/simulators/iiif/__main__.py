"""``python -m include.simulators.iiif``: a museum's IIIF Change Discovery stream as a process.

The demo starts it like this (start-up line and shutdown: ``include.simulators.cli``); the
Connection's host is ``<base>/stream/collection.json``; ``/_control/mutate`` and
``/_control/live_ids`` drive and read it (``IiifServer.control``).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from ..cli import add_listen_arguments, serve_until_signalled, simulator_parser
from .museum import Museum
from .server import IiifServer


def _parser() -> argparse.ArgumentParser:
    parser = simulator_parser(__package__, "Simulated museum IIIF Change Discovery 1.0 stream on loopback.")
    parser.add_argument("--objects", type=int, default=1000)
    parser.add_argument("--page-sizes", default="100", help="comma-separated page sizes, cycled")
    parser.add_argument("--fractions", action="store_true", help="endTimes with microseconds")
    parser.add_argument("--lido", action="store_true", help="offer a LIDO seeAlso besides Linked Art")
    parser.add_argument("--response-delay-ms", type=float, default=0.0)
    add_listen_arguments(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    museum = Museum(page_sizes=tuple(int(p) for p in args.page_sizes.split(",")), fractions=args.fractions,
                    lido_too=args.lido)
    museum.create(args.objects)
    server = IiifServer(museum, host=args.host, port=args.port)
    server.delay = args.response_delay_ms / 1000
    return serve_until_signalled(server)


if __name__ == "__main__":
    raise SystemExit(main())
