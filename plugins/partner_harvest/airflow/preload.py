"""The library imported once in the Airflow processes that fork task and parse processes.

A LocalExecutor worker forks one process per task, and the
dag-processor one per DAG file parse. Each child would import this library again and
parse the registry again: on a quiet night that import is about a third of the task's CPU.
Airflow loads plugins when any of its jobs starts (a scheduler before it forks its
workers, the dag-processor before its first parse), and the plugin imports this module, so
forked children inherit the modules. Before each fork the parent brings its registry cache
up to date (a hash of the file when nothing changed), so a child inherits that as well; the
cache is keyed by the file's content, so a child never sees an outdated registry.
"""

from __future__ import annotations

import logging
import os

from partner_harvest.airflow import dag_factory  # noqa: F401 (importing it is the point)
from partner_harvest.registry import load_registry

log = logging.getLogger(__name__)
_warmed: dict[str, bool] = {"registered": False}


def warm_registry() -> None:
    """Read the registry into this process's cache; never fail a fork over it (a broken
    registry is reported by the DAG files, in the process that parses them)."""
    try:
        load_registry()
    except Exception as exc:  # noqa: BLE001 (a fork must go on whatever the file holds)
        log.debug("partner_harvest: registry not preloaded before a fork: %s", exc)


def register() -> None:
    """Warm the registry before every fork of this process (once per process)."""
    if not _warmed["registered"]:
        os.register_at_fork(before=warm_registry)
        _warmed["registered"] = True
