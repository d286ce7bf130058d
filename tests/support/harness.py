"""A partner pointed at a protocol simulator on loopback, run as the DAG runs it.

The harness keeps what Airflow keeps between runs (the cursors, the run count) and hands
each run to ``partner_harvest.run.run_partner``: freeze, plan, harvest, apply, cursors.
A test that checks one step calls that step (``partner_harvest.run.freeze``, ``stage``...)
with the harness's adapter and cursors.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

import psycopg

from partner_harvest import pipeline
from partner_harvest.factory import Endpoint, build_adapter
from partner_harvest.records import HarvestStats
from partner_harvest.registry import Partner
from partner_harvest.run import CHANGES, Kept, RunResult, apply, freeze, plan, run_partner, stage_channel
from partner_harvest.sierra.harvester import SierraAdapter
from partner_harvest.sierra.spec import DELETIONS
from partner_harvest.store.apply import ApplyResult
from partner_harvest.window import Window
from tests.support.db import audit_row, held

SIERRA_KEY, SIERRA_SECRET = "demo-key", "s3cr3t-demo-secret"


class _Cursor:
    """A harness attribute reading and writing one channel's cursor in ``cursors``."""

    def __init__(self, channel: str) -> None:
        self.channel = channel

    def __get__(self, harness: Any, owner: type | None = None) -> Any:
        return self if harness is None else harness.cursors.get(self.channel)

    def __set__(self, harness: Any, value: datetime | None) -> None:
        harness.cursors[self.channel] = value


class Harness:
    """Plays the DAG for one partner: each ``run`` is one DAG run, the cursors carried over."""

    def __init__(self, sim: Any, conn: psycopg.Connection, partner: Partner) -> None:
        self.sim, self.conn, self.partner = sim, conn, partner
        self.cursors: dict[str, datetime | None] = {}
        self.runs = 0
        self.last: RunResult | None = None

    cursor = _Cursor(CHANGES)

    def endpoint(self) -> Endpoint:
        return Endpoint(self.sim.base_url)

    def adapter(self) -> Any:
        return build_adapter(self.partner, self.endpoint())

    def next_run_id(self) -> str:
        self.runs += 1
        return f"run-{self.runs}"

    def freeze(self, mode: str = "incremental", from_: datetime | None = None,
               until: datetime | None = None) -> Window:
        return freeze(self.partner, self.adapter(), self.conn, Kept(dict(self.cursors)),
                      pipeline.RunRequest(mode, from_, until))

    def run_through(self, mode: str = "incremental", *, window: Window | None = None,
                    from_: datetime | None = None, until: datetime | None = None,
                    on_staged: Callable[[str], None] | None = None) -> RunResult:
        """One run; the whole result (window, plan, each channel's harvest, apply, cursors)."""
        request = pipeline.RunRequest(mode, from_, until)
        result = run_partner(self.partner, self.adapter(), self.conn, self.next_run_id(), self.cursors, request,
                             window=window, on_staged=on_staged)
        self.cursors = result.cursors
        self.last = result
        return result

    def held(self) -> set[str]:
        return held(self.conn, self.partner.id)

    def audit(self, run_id: str, channel: str = CHANGES) -> dict:
        return audit_row(self.conn, self.partner.id, run_id, channel)


class OaiHarness(Harness):
    """An OAI-PMH partner: ``run`` returns (window, changes harvested, applied)."""

    def run(self, mode: str = "incremental", window: Window | None = None,
            **kw: Any) -> tuple[Window, HarvestStats, ApplyResult]:
        result = self.run_through(mode, window=window, **kw)
        return result.window, result.changes, result.applied


class SierraHarness(Harness):
    """A Sierra partner logging in with ``key``/``secret``; its adapter's sleeps are recorded,
    not slept. ``run`` returns (window, changes, deletions, applied)."""

    def __init__(self, sim: Any, conn: psycopg.Connection, partner: Partner,
                 secret: str = SIERRA_SECRET, key: str = SIERRA_KEY) -> None:
        super().__init__(sim, conn, partner)
        self.key, self.secret = key, secret
        self.sleeps: list[float] = []
        self.on_sleep: Callable[[], None] = lambda: None

    deletions_cursor = _Cursor(DELETIONS)

    def endpoint(self) -> Endpoint:
        return Endpoint(self.sim.base_url, self.key, self.secret)

    def adapter(self) -> Any:
        adapter = build_adapter(self.partner, self.endpoint())

        def sleep(seconds: float) -> None:
            self.sleeps.append(seconds)
            self.on_sleep()

        assert isinstance(adapter, SierraAdapter)
        adapter.sleep = sleep
        return adapter

    def run(self, mode: str = "incremental", between: Callable[[], None] | None = None,
            **kw: Any) -> tuple[Window, HarvestStats, HarvestStats, ApplyResult]:
        """``between`` runs after the change harvest, before the deletion poll."""

        def staged(channel: str) -> None:
            if between is not None and channel == CHANGES:
                between()

        result = self.run_through(mode, on_staged=staged, **kw)
        return result.window, result.changes, result.staged[DELETIONS], result.applied  # a Sierra run always has it


class PieceRun:
    """One run of the DAG's tasks piece by piece (a sliced run's mapped harvests in any
    order, any one failing and retried on its own): freeze and plan at once, then
    ``harvest(channel)`` per piece and ``apply``. ``make`` builds a fresh adapter per
    task, as each Airflow task does."""

    def __init__(self, conn: psycopg.Connection, partner: Partner, make: Callable[[], Any], run_id: str = "run-1",
                 mode: str = "incremental") -> None:
        self.conn, self.partner, self.make, self.run_id = conn, partner, make, run_id
        self.window = freeze(partner, make(), conn, request=pipeline.RunRequest(mode))
        self.pieces = plan(partner, make(), conn, run_id, self.window)

    def harvest(self, channel: str) -> HarvestStats:
        return stage_channel(self.make(), self.conn, self.run_id, self.window, channel)

    def harvest_all(self, but: str | None = None) -> None:
        """Harvest every piece of the plan (``but`` one, already harvested by the test)."""
        for piece in self.pieces:
            if piece["channel"] != but:
                self.harvest(piece["channel"])

    def apply(self, reharvested: list[str] | None = None) -> ApplyResult:
        outlets = Kept()
        applied = apply(self.conn, self.partner.id, self.run_id, self.window, outlets, self.make)
        if reharvested is not None:
            reharvested.extend(outlets.staged)  # the channels the apply staged again
        return applied

    def rows(self) -> dict[str, dict]:
        from partner_harvest.store.slices import slice_rows

        return {row["channel"]: row for row in slice_rows(self.conn, self.partner.id, self.run_id)}


def run_once(sim: Any, conn: psycopg.Connection, partner: Partner, run_id: str = "run-1",
             cursors: dict[str, datetime | None] | None = None, request: pipeline.RunRequest | None = None,
             **kw: Any) -> RunResult:
    """One DAG run of an OAI-PMH ``partner`` against the simulator (or replay) ``sim``, with a
    fresh adapter as each run builds; the cursors are the caller's (none: a first run)."""
    adapter = build_adapter(partner, Endpoint(sim.base_url))
    return run_partner(partner, adapter, conn, run_id, cursors, request, **kw)
