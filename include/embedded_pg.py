"""An embedded PostgreSQL for the demo and the tests (the PyPI package ``pgserver``).

A database given in ``HARVEST_DATABASE_URL`` is used as is; otherwise a private server is
started in a short path under the temp directory (Unix socket paths are length-limited).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pgserver.postgres_server import PostgresServer

DATABASE_URL_ENV = "HARVEST_DATABASE_URL"


def data_dir(label: str) -> Path:
    project = str(Path(__file__).resolve().parents[1])
    digest = hashlib.sha1(project.encode()).hexdigest()[:8]
    return Path(tempfile.gettempdir()) / f"ph-{label}-{digest}"


def start(label: str = "pg", *, keep_running: bool = False) -> str:
    """Return a libpq URI to a running server (the given one, or an embedded one)."""
    given = os.environ.get(DATABASE_URL_ENV)
    if given:
        return given
    import pgserver  # imported late: not needed when a database is given

    server = pgserver.get_server(data_dir(label), cleanup_mode=None if keep_running else "stop")
    return server.get_uri()


def server(label: str) -> PostgresServer:
    """The embedded server object itself (stopped by ``.cleanup()``); for test fixtures."""
    import pgserver

    return pgserver.get_server(data_dir(label), cleanup_mode="stop")


def stop(label: str = "pg") -> None:
    """Stop the embedded server started with ``keep_running=True`` (no-op otherwise)."""
    if os.environ.get(DATABASE_URL_ENV):
        return
    import pgserver

    server = pgserver.get_server(data_dir(label), cleanup_mode="stop")
    server.cleanup()


def stop_leftover(label: str) -> bool:
    """Stop a server still running in ``label``'s data directory; True when one was.

    ``restart_immediately`` starts a new postmaster that pgserver does not track, so its
    cleanup at exit stops nothing and the server outlives the tests (a later run in the
    same checkout then met it half-alive).
    """
    import getpass

    from pgserver._commands import create_command_function

    pg_ctl = create_command_function("pg_ctl")  # what pgserver exports as pg_ctl (made at import)

    if not (data_dir(label) / "postmaster.pid").exists():
        return False
    user = "pgserver" if getpass.getuser() == "root" else None
    try:
        pg_ctl(["-m", "fast", "-w", "stop"], pgdata=data_dir(label), user=user, timeout=60)
    except Exception:  # already gone between the check and the stop
        return False
    return True


def restart_immediately(label: str, conninfo: str | None = None, timeout: float = 60.0) -> None:
    """Fault injection: ``pg_ctl restart -m immediate`` of the embedded server.

    An immediate shutdown skips the checkpoint, so the restart runs crash recovery: open
    connections are cut and UNLOGGED tables come back empty, as after a power cut. With
    ``conninfo``, returns once the server answers again (at most ``timeout`` seconds).
    """
    import getpass

    from pgserver._commands import create_command_function

    pg_ctl = create_command_function("pg_ctl")  # what pgserver exports as pg_ctl (made at import)

    user = "pgserver" if getpass.getuser() == "root" else None  # pgserver's own user when root
    pg_ctl(["-m", "immediate", "-w", "restart"], pgdata=data_dir(label), user=user, timeout=120)
    if conninfo is not None:
        _wait_until_answering(conninfo, timeout)


def _wait_until_answering(conninfo: str, timeout: float) -> None:
    import time

    import psycopg

    deadline = time.monotonic() + timeout
    while True:
        try:
            with psycopg.connect(conninfo, connect_timeout=2) as probe:
                probe.execute("SELECT 1")
                return
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
