"""The library imported once in the Airflow processes that fork task and parse processes.

A LocalExecutor worker forks one process per task, and the
dag-processor one per DAG file parse. Each child would import this library again and
parse the registry again: on a quiet night that import is about a third of the task's CPU.
Airflow loads plugins when any of its jobs starts (a scheduler before it forks its
workers, the dag-processor before its first parse), and the plugin imports this module, so
forked children inherit the modules. Before each fork the parent brings its registry cache
up to date (a hash of the file when nothing changed), so a child inherits that as well; the
cache is keyed by the file's content, so a child never sees an outdated registry.

What a DAG's first build loads lazily is loaded here too: Airflow discovers the providers'
asset URI handlers on the first Asset a process makes (0.2 s unloaded, up to 0.6 s on a
loaded machine, in every task's parse of its DAG otherwise: six tasks on a harvest's path).
So are the protocols' adapters, which a task imports when it builds one (OAI-PMH 23 ms,
Sierra 83 ms with pymarc's MARC-8 tables, in every task that talks to a partner otherwise).
"""

from __future__ import annotations

import importlib
import logging
import os

from partner_harvest.airflow import dag_factory  # noqa: F401 (importing it is the point)
from partner_harvest.airflow.assets import partner_asset
from partner_harvest.protocols import specs
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


def warm_definitions() -> None:
    """Make one Asset, as every partner's DAG does: the providers' URI handlers are then
    discovered in this process, once, not in each forked child; and import every protocol's
    adapter module. Never fails the plugin."""
    try:
        partner_asset("preload")
        for spec in specs():
            importlib.import_module(spec.stack)
    except Exception as exc:  # noqa: BLE001 (the DAG's own parse reports a real problem)
        log.debug("partner_harvest: definitions not preloaded: %s", exc)


def register() -> None:
    """Warm the definitions once, and the registry before every fork of this process (once per process)."""
    if not _warmed["registered"]:
        warm_definitions()
        os.register_at_fork(before=warm_registry)
        _warmed["registered"] = True
