"""What every simulator's ``python -m`` entry point shares.

Benchmarks and the demo start a simulator as a child process and read exactly
one line, ``listening on <base_url>``, to learn where it is (``--port 0``
picks a free port); they stop it with SIGTERM.
"""

from __future__ import annotations

import argparse
import signal
import threading

from .loopback import LoopbackServer


def simulator_parser(package: str | None, description: str) -> argparse.ArgumentParser:
    """A parser whose usage line shows how the simulator is started: ``python -m <package>``."""
    return argparse.ArgumentParser(prog=f"python -m {package}", description=description)


def add_listen_arguments(parser: argparse.ArgumentParser) -> None:
    """``--host`` and ``--port`` (0: any free port), loopback by default."""
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)


def serve_until_signalled(simulator: LoopbackServer) -> int:
    """Start `simulator`, print the one ``listening on`` line, serve until SIGTERM
    or SIGINT, then stop cleanly; returns the process exit code."""
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    with simulator as sim:
        print(f"listening on {sim.base_url}", flush=True)
        while not stop.wait(0.2):
            pass
    return 0
