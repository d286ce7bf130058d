"""Chaos nights: many simulated nights per partner through Airflow, one fault a night,
and after every night a check that the mirror equals the partner.

Each partner's simulator lives in this process (threads), so it outlives the nights it
serves; each night's DAG run is a child process (night.py) so that a fault may SIGKILL
it. With ``scheduler=True`` (``--scheduler``) the nights are DAG runs of a real Airflow
scheduler instead (scheduler.py): a fault kills the task process the scheduler launched,
and the scheduler retries it (arm.py). Nothing is repaired by hand: a night killed in flight is run again under the same
run id (what Airflow does when the scheduler retries the dead task, or an operator
clears the run), failures inside a task are retried by Airflow itself (dag.test honours
``retries``), and a night that still fails is left for the next scheduled night.

Pauses: a night's process stopped with a real SIGSTOP (faults.py) is held until
its lease lapsed; meanwhile the partner changes upstream and a second harvest (or an
operator command, for a run waiting between tries) takes the partner; then SIGCONT, and
the night goes on. The oracle wants the mirror to equal the partner after it, as always.

Deterministic for a seed: every choice (changes, fault, its moment) comes from
``random.Random(f"{seed}/{partner}/{night}")``, so one night replays alone with
``--partners <p> --nights <n>`` and the same seed (the nights before it are replayed too,
quickly, to rebuild the partner's state).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any
from unittest import mock

import psycopg

from benchmarks.soak.faults import IIIF, Fault, applicable
from benchmarks.soak.faults import fault as fault_of
from include.simulators.iiif import IiifServer, Museum
from include.simulators.oai_pmh import OaiSimulator, SimulatedRepository
from include.simulators.sierra import SierraSimulator, SimulatedCatalogue
from partner_harvest.store.db import scalar

if TYPE_CHECKING:
    from benchmarks.soak.scheduler import SchedulerStack
    from include.simulators.sierra.server import Headers

ROOT = Path(__file__).resolve().parents[2]
START = datetime(2026, 6, 1, tzinfo=timezone.utc)
LAG = timedelta(minutes=5)
LEASE_TTL_SECONDS = 3
RERUNS = 2  # a killed night is run again at most this often before the next night takes over
# The reconcile of an approved_after_quiet_night night: its purge asks (any purge is over the
# limit), and the night's process stops while it waits, then approves (night.py).
APPROVAL_ARGS = ("--max-purge-fraction", "0.001", "--approve-after-stop")
KEEP_ALIVE_TIMEOUT = 5.0  # the Sierra simulator's default (Apache's): restored after a night that shortens it
RETRIES = 2  # Airflow task retries (the registry's default is 3; the soak keeps nights short)
HTTP_RETRIES = 2
# Registry keys retry_delay and max_retry_delay: on --scheduler nights the scheduler itself waits this
# before it retries a failed or killed task (dag.test nights shorten it to 1 s per task).
RETRY_DELAY, MAX_RETRY_DELAY, EXECUTION_TIMEOUT = "2s", "4s", "10m"
SIERRA_KEY, SIERRA_SECRET = "soak-key", "soak-secret-never-logged"


@dataclass(frozen=True)
class Waits:
    """How long a night waits between tries; never what a fault does or how often it fires.

    The defaults are the soak command's (python -m benchmarks.soak). The test suite runs the
    same nights with ``FAST_WAITS``: every retry still happens, the same number of times,
    just without the idle seconds between tries."""

    retry_delay: str = RETRY_DELAY  # registry retry_delay: the scheduler's wait (--scheduler nights)
    max_retry_delay: str = MAX_RETRY_DELAY
    dag_test_retry_seconds: float = 1.0  # dag.test nights: each task's retry_delay (night.py)
    sierra_server_error_backoff: float | None = None  # options.sierra; None: the registry default (2 s, 4 s)
    # The lease TTL of a run the soak stops (a pause must outlast it); None: LEASE_TTL_SECONDS.
    pause_lease_ttl_seconds: float | None = None


FAST_WAITS = Waits(retry_delay="1s", max_retry_delay="1s", dag_test_retry_seconds=0.0,
                   sierra_server_error_backoff=0.01, pause_lease_ttl_seconds=1.0)


@dataclass(frozen=True)
class PartnerSpec:
    id: str
    protocol: str  # "oai-pmh" | "sierra" | "iiif-change-discovery"
    deleted_record: str = "persistent"
    granularity: str = "seconds"
    sliced: bool = False  # a full load in slices (IIIF: ranges of the page chain, checkpointed by page)
    items: bool = False  # Sierra: items and holdings too (options.sierra.channels), checked table by table

    @property
    def reconciled(self) -> bool:
        """deletedRecord=no: deletions reach the mirror only through the weekly reconcile (an
        IIIF stream: its Refresh truncates the history, Deletes before it with it)."""
        return self.deleted_record == "no"


PARTNERS: dict[str, PartnerSpec] = {p.id: p for p in (
    PartnerSpec("soak_persistent", "oai-pmh", "persistent", "seconds"),
    PartnerSpec("soak_no_deletions", "oai-pmh", "no", "seconds"),
    PartnerSpec("soak_daily", "oai-pmh", "persistent", "day"),
    PartnerSpec("soak_sierra", "sierra"),
    PartnerSpec("soak_sierra_b", "sierra"),  # a second library: its own full load, so both export faults meet one
    PartnerSpec("soak_sierra_c", "sierra"),  # a third: its full load meets idle keep-alive closing and poison bibs
    PartnerSpec("soak_sierra_items", "sierra", items=True),  # items and holdings: checkouts, transfers, deletions
    PartnerSpec("soak_iiif", IIIF, sliced=True),  # a Refresh now and then keeps the stream's history; loads in slices
    PartnerSpec("soak_iiif_refresh", IIIF, "no"),  # its Refresh truncates the history: the reconcile finds the lost Deletes
)}


def execution_timeout(size: int) -> str:
    """A task's cap fit for the soak's size: a night crossing a Refresh fetches every object's
    description again in one task, which 10 minutes cannot hold at 50,000 objects on 2 cores."""
    return EXECUTION_TIMEOUT if size <= 5000 else f"{max(1, size // 25000)}h"


def registry_yaml(partners: list[PartnerSpec], waits: Waits = Waits(), timeout: str = EXECUTION_TIMEOUT) -> str:
    lines = ["partners:"]
    # The soak's clock runs fast: HTTP back-offs, Retry-After and the politeness back-off
    # (options.politeness, shared by every soak partner on 127.0.0.1) are shrunk alike.
    http = (f"http: {{backoff_factor: 0.01, retries: {HTTP_RETRIES}, retry_after_cap: 2}},"
            " politeness: {backoff_step: 20, max_backoff: 200}")
    # A night stopped at an approval gate ends after 10 minutes (the run abandoned, so the
    # night's check shows what it left) instead of waiting for a person who never comes.
    airflow = (f"retries: {RETRIES}, retry_delay: {waits.retry_delay}, max_retry_delay: {waits.max_retry_delay},"
               f" execution_timeout: {timeout}, approval_timeout: 10m, approval_timeout_action: abandon")
    for p in partners:
        if p.protocol == "sierra":
            sierra = ([] if waits.sierra_server_error_backoff is None
                      else [f"server_error_backoff: {waits.sierra_server_error_backoff}"])
            if p.items:
                sierra.append("channels: [bibs, items, holdings]")
            options = f" sierra: {{{', '.join(sierra)}}}," if sierra else ""
            lines.append(f"  - {{id: {p.id}, protocol: sierra, conn_id: partner_{p.id}, page_size: 10, lag: 5m,"
                         f" {airflow}, deletion_overlap_days: 1, options: {{{http},{options}"
                         " export: {limit: 100, rate_limit_wait: 0}}}")
        elif p.protocol == IIIF:
            # sliced: a full load of more than 100 activities in up to 4 slices (the short soak's 200: 2)
            slicing = " slicing: {threshold_records: 100, target_records: 100, max_slices: 4}," if p.sliced else ""
            lines.append(f"  - {{id: {p.id}, protocol: {IIIF}, conn_id: partner_{p.id}, lag: 5m, pool_slots: 2,"
                         f" {airflow},{slicing} max_purge_fraction: 0.5,"
                         f" options: {{{http}, iiif: {{description_concurrency: 2}}}}}}")
        else:
            lines.append(f"  - {{id: {p.id}, protocol: oai-pmh, conn_id: partner_{p.id}, metadata_prefix: oai_dc,"
                         f" lag: 5m, {airflow}, max_purge_fraction: 0.5, options: {{{http}}}}}")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------ the partner end
class Partner:
    """A simulator, its model, and the tripwire the soak hangs on its list pages."""

    def __init__(self, spec: PartnerSpec, seed: int, size: int) -> None:
        self.spec = spec
        self.trip: dict[str, Any] | None = None  # {"page": k, "do": callable}
        self.asking = "harvest_changes"  # the task whose request is being answered
        self.full_load_night = False  # tonight's harvest is a full load (a pause picks its page by it)
        self.list_requests = 0
        self.touched: set[str] = set()  # changed while a harvest ran (after the oracle's snapshot)
        self.changed_at: dict[str, datetime] = {}  # the partner's clock when each id last changed
        self.child: _Pid | None = None  # the night's process, while one runs
        self.model: SimulatedCatalogue | Museum | SimulatedRepository
        self.sim: SierraSimulator | IiifServer | OaiSimulator
        if spec.protocol == "sierra":
            catalogue = SimulatedCatalogue(bibs=size, deleted_fraction=0.03, seed=seed, invalid_every=0,
                                           start_clock=START - timedelta(days=1))
            if spec.items:  # mixed fixedFields types, as some servers send them
                catalogue.attach("items", size * 2)
                catalogue.attach("holdings", max(10, size // 5))
            sierra = SierraSimulator(catalogue, client_key=SIERRA_KEY, client_secret=SIERRA_SECRET,
                                     mixed_fixed_types=spec.items)
            answer = sierra.handle

            def handle(method: str, path: str, query: str, headers: Headers, body: bytes) -> Any:
                if method == "GET" and path.endswith(("/bibs", "/bibs/marc")):
                    self._page_request("poll_deletions" if "deletedDate" in query else "harvest_changes")
                elif method == "GET" and path.endswith(("/items", "/holdings")):  # their polls' pages count too
                    kind = path.rsplit("/", 1)[-1]
                    singular = "item" if kind == "items" else "holding"
                    self._page_request(f"poll_{singular}_deletions" if "deletedDate" in query else f"poll_{kind}")
                return answer(method, path, query, headers, body)

            mock.patch.object(sierra, "handle", handle).start()  # for this simulator's life
            self.model, self.sim = catalogue, sierra
        elif spec.protocol == IIIF:
            museum = Museum(page_sizes=(10, 7, 13), fractions=True, invalid_every=41, now=START - timedelta(days=1))
            museum.create(size)
            server = IiifServer(museum)

            def on_request(path: str) -> None:  # a "page" of a stream's harvest: one description
                if "/objects/" in path:
                    self._page_request("harvest_changes")

            server.on_request = on_request
            self.model, self.sim = museum, server
        else:
            repo = SimulatedRepository(records=size, page_size=10, seed=seed, invalid_every=41,
                                       deleted_record=spec.deleted_record, granularity=spec.granularity,
                                       start_clock=START - timedelta(days=1))
            oai = OaiSimulator(repo)
            answer_oai = oai.handle_oai

            def handle_oai(pairs: list[tuple[str, str]]) -> Any:
                if any(k == "verb" and v in ("ListRecords", "ListIdentifiers") for k, v in pairs):
                    self._page_request("harvest_changes")
                return answer_oai(pairs)

            mock.patch.object(oai, "handle_oai", handle_oai).start()  # for this simulator's life
            self.model, self.sim = repo, oai
        self.sim.start()

    # ---- the protocol's own simulator and model (the soak's fault kinds fit their protocol)
    @property
    def oai(self) -> OaiSimulator:
        assert isinstance(self.sim, OaiSimulator), self.spec.protocol
        return self.sim

    @property
    def sierra(self) -> SierraSimulator:
        assert isinstance(self.sim, SierraSimulator), self.spec.protocol
        return self.sim

    @property
    def tokens(self) -> OaiSimulator | SierraSimulator:
        """The simulator of a protocol with tokens to expire."""
        assert isinstance(self.sim, (OaiSimulator, SierraSimulator)), self.spec.protocol
        return self.sim

    @property
    def museum(self) -> Museum:
        assert isinstance(self.model, Museum), self.spec.protocol
        return self.model

    @property
    def catalogue(self) -> SimulatedCatalogue:
        assert isinstance(self.model, SimulatedCatalogue), self.spec.protocol
        return self.model

    @property
    def records(self) -> SimulatedCatalogue | SimulatedRepository:
        """The model of OAI-PMH and Sierra partners (edits, deletions, additions alike)."""
        assert isinstance(self.model, (SimulatedCatalogue, SimulatedRepository)), self.spec.protocol
        return self.model

    @property
    def stopped_pid(self) -> int:
        """The pid of the night's process (a fault stops or kills it)."""
        assert self.child is not None, "no night process runs"
        return self.child.pid

    def connection(self) -> dict[str, Any]:
        conn = {"conn_type": "http", "host": self.sim.base_url}
        if isinstance(self.sim, IiifServer):
            conn["host"] = self.sim.collection_url
        if self.spec.protocol == "sierra":
            conn.update(login=SIERRA_KEY, password=SIERRA_SECRET)
        return conn

    def _page_request(self, task_id: str) -> None:
        """Count list pages; when the armed one is asked for, act before answering it."""
        self.asking = task_id
        self.list_requests += 1
        trip = self.trip
        if trip and self.list_requests > trip["page"]:
            self.trip = None
            trip["do"]()

    def close(self) -> None:
        self.sim.stop()

    # ---- what partner staff do
    def day_of_changes(self, rng: random.Random, scale: int) -> dict[str, list[str]]:
        if self.spec.protocol == IIIF:
            return self._museum_day(rng, scale)
        m = self.records
        with m.lock:
            done = {"edited": m.edit(rng.randint(scale, 2 * scale)),
                    "deleted": m.delete(rng.randint(1, max(1, scale // 3))),
                    "added": m.add(rng.randint(1, max(1, scale // 2)))}
            if isinstance(m, SimulatedRepository):
                done["recreated"] = m.recreate(rng.randint(0, 2))
                done["moved"] = m.move_sets(rng.randint(0, 3))
            self._stamp(i for ids in done.values() for i in ids)
            if self.spec.items:  # a library's day at the desk: checkouts, transfers, weeding, suppressions
                items, holdings = self.catalogue.attached["items"], self.catalogue.attached["holdings"]
                items.checkout(rng.randint(scale, 2 * scale))
                items.transfer(rng.randint(1, 3))
                items.delete(rng.randint(1, 3))
                items.suppress(rng.randint(0, 2))
                items.suppress(rng.randint(0, 1), on=False)
                items.add(rng.randint(0, 3))
                holdings.checkout(rng.randint(1, 3))
                holdings.delete(rng.randint(0, 1))
        return done

    def _museum_day(self, rng: random.Random, scale: int) -> dict[str, list[str]]:
        """A museum's day: edits, deletions, moves, new objects, re-created ones, now and then
        a Refresh (truncating the history when the spec says deletions need the reconcile)."""
        m = self.museum
        base = self.sim.base_url
        with m.lock:
            done = m.mutate(edit=rng.randint(scale, 2 * scale), delete=rng.randint(1, max(1, scale // 3)),
                            add=rng.randint(1, max(1, scale // 2)), move=rng.randint(0, 3))
            gone = sorted(m.gone - set(m.live), key=lambda s: int(s[1:]))
            done["recreated"] = []
            for slug in rng.sample(gone, min(len(gone), rng.randint(0, 2))):
                m.recreate(slug)
                done["recreated"].append(slug)
            if rng.random() < 0.2:
                m.refresh(truncate=self.spec.reconciled)
                done["refresh"] = []
                m.update(rng.choice(sorted(m.live)))  # life goes on after the rebuild
            ids = {m.identifier(base, slug) for slugs in done.values() for slug in slugs}
            self._stamp(ids)
        return {k: [m.identifier(base, s) for s in v] for k, v in done.items()}

    def _stamp(self, ids: Any) -> None:
        """Remember the partner's clock at a change (caller holds the model's lock)."""
        now = self.model.clock
        self.changed_at.update((i, now) for i in ids)

    def stamped_after_now(self) -> set[str]:
        """Ids whose last change carries a stamp after the partner's clock (it was set back):
        no window up to that clock can see them; the night the clock passes them again must."""
        now = self.model.clock
        return {i for i, at in self.changed_at.items() if at > now}

    def changes_while_paused(self, rng: random.Random) -> list[str]:
        """Staff at work while a run is stopped, after it froze its window or swept past
        them: records created, edited and deleted (and, OAI, re-created and moved) that the
        stopped run cannot have seen; the second harvest must bring them in."""
        self.model.advance_clock(timedelta(minutes=10))  # stamped after the stopped run's clock
        if self.spec.protocol == IIIF:
            museum = self.museum
            with museum.lock:
                done = museum.mutate(edit=rng.randint(1, 3), delete=1, add=rng.randint(1, 3), move=rng.randint(0, 1))
                ids = [museum.identifier(self.sim.base_url, s) for slugs in done.values() for s in slugs]
                self._stamp(ids)
            museum.advance_clock(timedelta(hours=1))
            return ids
        m = self.records
        with m.lock:
            ids = m.add(rng.randint(1, 3)) + m.edit(rng.randint(1, 3)) + m.delete(1)
            if isinstance(m, SimulatedRepository):
                ids += m.recreate(rng.randint(0, 1)) + m.move_sets(rng.randint(0, 1))
            self._stamp(ids)
        m.advance_clock(timedelta(hours=1))  # past the lag: inside the second harvest's window
        return ids

    def changes_during_harvest(self, rng: random.Random) -> None:
        if self.spec.protocol == IIIF:  # appended after the run froze its bound: the next night's
            museum = self.museum
            with museum.lock:
                done = museum.mutate(edit=rng.randint(1, 3), delete=1, add=1, move=1)
                ids = [museum.identifier(self.sim.base_url, s) for slugs in done.values() for s in slugs]
                self._stamp(ids)
            self.touched.update(ids)
            return
        m = self.records
        with m.lock:
            ids = m.edit(rng.randint(1, 3)) + m.delete(1) + m.add(1)
            if isinstance(m, SimulatedRepository):
                ids += m.recreate(1) + m.move_sets(1)
            self._stamp(ids)
        self.touched.update(ids)

    # ---- the oracle's view
    def snapshot(self) -> dict[str, Any]:
        """Live identifiers with what the mirror must hold for them, and the invalid ones."""
        m = self.model
        expect: dict[str, tuple[str, tuple[str, ...]]] = {}
        invalid: set[str] = set()
        deleted: set[str]
        with m.lock:
            if isinstance(m, Museum):
                base = self.sim.base_url
                for slug, version in m.live.items():
                    if m.is_invalid(slug):
                        invalid.add(m.identifier(base, slug))
                    else:
                        expect[m.identifier(base, slug)] = (m.title(slug, version), ())
                deleted = {m.identifier(base, slug) for slug in m.gone - set(m.live)}
            elif isinstance(m, SimulatedCatalogue):
                for bib in m.bibs(int(i) for i in m.sorted_live_ids()):
                    if not (bib.suppressed or bib.no_marc):  # options.sierra.suppressed: purge (the default)
                        expect[bib.id] = (bib.title.strip(), ())
                deleted = m.deleted_ids()
                if self.spec.items:
                    return {"expect": expect, "invalid": invalid, "deleted": deleted,
                            "attached": {kind: m.attached[kind].live(public_only=True) for kind in ("items", "holdings")}}
            else:
                from include.simulators.oai_pmh import payloads

                for rec in (m[identifier] for identifier in m.sorted_live_identifiers()):
                    if rec.invalid:
                        invalid.add(rec.identifier)
                    else:
                        expect[rec.identifier] = (payloads.title(rec), tuple(sorted(rec.sets)))
                deleted = set(m.deleted_identifiers())
        return {"expect": expect, "invalid": invalid, "deleted": deleted}


@dataclass
class _Pid:
    pid: int


# ------------------------------------------------------------------------ one night's record
@dataclass
class Night:
    partner: str
    night: int
    fault: str
    fired: bool = False
    outcome: str = ""  # clean | retried | rerun | next-night | failed
    attempts: int = 0  # dag.test runs of this night's run id (1 + reruns)
    task_retries: int = 0
    reconcile: bool = False
    seconds: float = 0.0
    divergence: list[str] = field(default_factory=list)
    checked: str = ""  # strict | deferred | awaiting-reconcile
    notes: list[str] = field(default_factory=list)
    paused: str = ""  # a pause's moment (or "page <k>"); "" for other faults
    interloper: str = ""  # the second harvest's (or the operator command's) outcome


class Soak:
    def __init__(self, *, seed: int, nights: int | dict[str, int], partners: list[str], conninfo: str, pg_label: str,
                 workdir: Path, size: int = 300, reconcile_every: int = 7, plan: dict | None = None,
                 known_gaps: bool = False, scheduler: bool = False, waits: Waits = Waits(),
                 airflow_metadata: tuple[str, str] | None = None, only: tuple[str, ...] = (),
                 log: Callable[[str], object] = print) -> None:
        self.known_gaps = known_gaps
        self.only = only  # draw from these fault kinds alone (--only); the plan may name any
        self.waits = waits
        # --scheduler nights: (server URI, template database) to copy Airflow's metadata
        # database from, on that server, instead of migrating one on a server of its own.
        self.airflow_metadata = airflow_metadata
        self.scheduler = scheduler  # nights as DAG runs of a real scheduler (benchmarks/soak/scheduler.py)
        self.stack: SchedulerStack | None = None
        self.seed, self.nights, self.conninfo, self.pg_label = seed, nights, conninfo, pg_label
        self.specs = [PARTNERS[p] for p in partners]
        self.workdir, self.size, self.reconcile_every = workdir, size, reconcile_every
        self.plan = plan or {}  # (partner, night) -> fault kind; else a seeded pick
        self.log = log
        self.results: list[Night] = []
        self.cursor_high: dict[str, str] = {}
        self.reported_deleted: dict[str, set[str]] = {}

    # ---------------------------------------------------------------- environment
    def _env(self, partners: dict[str, Partner]) -> dict[str, str]:
        from psycopg.conninfo import conninfo_to_dict

        pg = conninfo_to_dict(self.conninfo)
        env = dict(os.environ)
        registry = self.workdir / "partners.yaml"
        registry.write_text(registry_yaml(self.specs, self.waits, execution_timeout(self.size)))
        env.update({
            "HARVEST_PARTNERS_FILE": str(registry),
            "HARVEST_LEASE_TTL_SECONDS": str(LEASE_TTL_SECONDS),
            "AIRFLOW_CONN_AGGREGATION_DB": json.dumps({
                "conn_type": "postgres", "host": pg.get("host"), "port": int(pg.get("port") or 5432),
                "login": pg.get("user"), "password": pg.get("password") or None, "schema": pg["dbname"]}),
            "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "plugins"), env.get("PYTHONPATH", "")]),
        })
        for pid, partner in partners.items():
            env[f"AIRFLOW_CONN_PARTNER_{pid.upper()}"] = json.dumps(partner.connection())
        return env

    # ---------------------------------------------------------------- running
    def run(self) -> list[Night]:
        # A partner's data seed depends on the soak's seed and the partner alone, so one
        # partner's nights replay the same when it runs without the others.
        partners = {s.id: Partner(s, self.seed * 10 + list(PARTNERS).index(s.id), self.size) for s in self.specs}
        env = self._env(partners)
        if self.scheduler:
            self._start_stack(env)
        else:
            self._start_zygote(env)
        try:
            for spec in self.specs:
                count = self.nights if isinstance(self.nights, int) else self.nights[spec.id]
                for night in range(1, count + 1):
                    self.results.append(self._night(partners[spec.id], night, env))
                if self.results[-1].checked != "strict":  # the last night proved nothing: settle
                    self.results.append(self._night(partners[spec.id], count + 1, env, settle=True))
        finally:
            for partner in partners.values():
                partner.close()
            if self.stack is not None:
                self.stack.stop()
            else:
                self._to_zygote.close()
                self.zygote.wait(timeout=60)
        return self.results

    def _start_stack(self, env: dict[str, str]) -> None:
        from benchmarks.soak.scheduler import SchedulerStack

        dag_ids = [f"harvest_{s.id}" for s in self.specs] + [f"reconcile_{s.id}" for s in self.specs if s.reconciled]
        if self.airflow_metadata:
            self._check_no_restart_meets_airflow()
        stack = SchedulerStack(self.workdir, env, dag_ids, [f"partner_{s.id}" for s in self.specs],
                               meta_label=f"{self.pg_label}-airflow", metadata_template=self.airflow_metadata)
        self.stack = stack
        try:
            stack.start()
        except BaseException:
            stack.stop()
            raise

    @property
    def started_stack(self) -> SchedulerStack:
        """The real scheduler's stack (nights with ``scheduler=True``)."""
        assert self.stack is not None, "the scheduler stack is not started"
        return self.stack

    def _check_no_restart_meets_airflow(self) -> None:
        """Airflow's metadata beside the aggregation database is only for planned nights
        without a PostgreSQL restart: a restart must hit the aggregation database alone."""
        for spec in self.specs:
            count = self.nights if isinstance(self.nights, int) else self.nights[spec.id]
            for night in range(1, count + 1):
                kind = self.plan.get((spec.id, night))
                if kind is None or fault_of(kind).action == "pg_restart":
                    raise ValueError(f"{spec.id} night {night} ({kind or 'unplanned'}) may restart PostgreSQL:"
                                     " Airflow's metadata database needs a server of its own")

    def _scheduled(self, partner: Partner, night: int, kind: str, moment: str = "",
                   action: str = "") -> tuple[dict[str, Any], bool]:
        """One night as a DAG run of the real scheduler: armed, triggered, awaited by polling
        its state; (the night's result, whether the armed fault fired in a task process)."""
        stack = self.started_stack
        dag_id = f"{kind}_{partner.spec.id}"
        run_id = f"soak__night{night:03d}__{kind}"
        self.current_run = (dag_id, run_id)
        if moment and action:
            stack.arm(dag_id, run_id, moment, action, self.pg_label)
        stack.trigger(dag_id, run_id, START + timedelta(days=night), {"mode": "incremental"} if kind == "harvest" else {})
        run = stack.wait(dag_id, run_id)
        fired = stack.disarm()
        keys = [f"harvest_cursor__{partner.spec.id}", f"harvest_cursor__{partner.spec.id}__deletions"]
        return {
            "run_id": run_id, "dag_id": dag_id, "state": run["state"],
            "tasks": {ti["task_id"]: {"state": ti["state"], "tries": ti["try_number"]}
                      for ti in stack.task_instances(dag_id, run_id)},
            "cursors": {key: stack.variable(key) for key in keys},
        }, fired

    def _kill_asking_task(self, partner: Partner, record: Night) -> None:
        """SIGKILL the task process the scheduler launched for the task asking for this page."""
        dag_id, run_id = self.current_run
        pid = self.started_stack.running_pid(dag_id, run_id, partner.asking)
        if pid is None:
            record.notes.append(f"no running {partner.asking} to kill")
            return
        os.kill(pid, signal.SIGKILL)
        record.notes.append(f"killed {partner.asking} pid {pid}")

    def _start_zygote(self, env: dict[str, str]) -> None:
        log = open(self.workdir / "zygote.log", "ab")
        self.zygote = subprocess.Popen([sys.executable, "-m", "benchmarks.soak.night", "--zygote"], cwd=ROOT, env=env,
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True)
        log.close()
        assert self.zygote.stdin is not None and self.zygote.stdout is not None  # both piped
        self._to_zygote, self._from_zygote = self.zygote.stdin, self.zygote.stdout
        ready = self._from_zygote.readline()
        if not ready.strip():
            raise RuntimeError(f"the night process did not start; see {self.workdir / 'zygote.log'}")

    def _answer(self) -> dict[str, Any]:
        line = self._from_zygote.readline()
        if not line:
            raise RuntimeError(f"the night process died; see {self.workdir / 'zygote.log'}")
        return json.loads(line)

    def _child(self, env: dict[str, str], partner: Partner, night: int, kind: str, moment: str = "",
               action: str = "", forget: bool = False, on_stop: Callable[[int], None] | None = None, tag: str = "",
               logical: datetime | None = None, lease_ttl: float | None = None,
               extra: tuple[str, ...] = ()) -> tuple[dict | None, int]:
        """One DAG run in a process forked from the warm zygote; (result or None, exit code).

        ``on_stop(pid)``: called while the process is stopped (SIGSTOP); SIGCONT after it."""
        name = f"{partner.spec.id}-{night}-{kind}{'-' + tag if tag else ''}"
        result = self.workdir / f"{name}.json"
        result.unlink(missing_ok=True)
        argv = ["--partner", partner.spec.id, "--kind", kind,
                "--logical", (logical or START + timedelta(days=night)).isoformat(), "--retries", str(RETRIES),
                "--retry-delay", str(self.waits.dag_test_retry_seconds),
                "--pg-label", self.pg_label, "--result", str(result)]
        if moment and action:
            argv += ["--moment", moment, "--action", action]
        if forget:
            argv.append("--forget-cursors")
        if lease_ttl is not None:
            argv += ["--lease-ttl", str(lease_ttl)]
        argv += list(extra)
        log = str(self.workdir / f"{name}.log")
        outer = partner.child
        pid = self._fork({"argv": argv, "log": log})
        partner.child = _Pid(pid)
        code = self._until_exit(pid, on_stop)
        if tag and outer is not None:
            partner.child = outer  # a second run within a pause: the page tripwires mean the first
        data = json.loads(result.read_text()) if result.exists() else None
        return data, code

    def _fork(self, order: dict[str, Any]) -> int:
        self._to_zygote.write(json.dumps(order) + "\n")
        self._to_zygote.flush()
        return self._answer()["pid"]

    def _until_exit(self, pid: int, on_stop: Callable[[int], None] | None = None) -> int:
        """The process's exit code; each time it is stopped: ``on_stop(pid)``, then SIGCONT."""
        while True:
            answer = self._answer()
            if "exit" in answer:
                return answer["exit"]
            try:
                if on_stop is None:
                    raise RuntimeError(f"process {pid} stopped, and nobody expected it to")
                on_stop(pid)
            finally:
                os.kill(pid, signal.SIGCONT)
                self._to_zygote.write(json.dumps({"wait": pid}) + "\n")
                self._to_zygote.flush()

    def _operator(self, name: str, argv: list[str]) -> tuple[int, str]:
        """``partner-harvest <argv>`` in a process of its own, as an operator types it."""
        log = self.workdir / f"{name}.log"
        log.unlink(missing_ok=True)
        code = self._until_exit(self._fork({"argv": argv, "log": str(log), "cli": True}))
        return code, log.read_text(errors="replace") if log.exists() else ""

    def _night(self, partner: Partner, night: int, env: dict[str, str], settle: bool = False) -> Night:
        spec = partner.spec
        rng = random.Random(f"{self.seed}/{spec.id}/{night}")
        full_load = night == 1
        kinds = applicable(spec.protocol, full_load, self.known_gaps, spec.reconciled, self.scheduler,
                           self.only, spec.items) or ["none"]
        kind = "none" if settle else self.plan.get((spec.id, night)) or rng.choice(kinds)
        kind, _, planned_moment = kind.partition("@")  # a plan may fix a pause's moment: kind@moment
        fault = fault_of(kind)
        if self.scheduler and fault.dag_test_only:
            raise ValueError(f"{spec.id} night {night}: {kind} runs on dag.test nights only (not --scheduler)")
        if fault.reconcile_only and not spec.reconciled:
            raise ValueError(f"{spec.id} night {night}: {kind} needs a partner with a reconcile")
        record = Night(spec.id, night, kind)
        # A pause's moment: between two tasks, or inside the next one, its lease taken.
        pause_moment = rng.choice(fault.moments) if fault.moments else ""
        if planned_moment:
            if planned_moment not in fault.moments:
                raise ValueError(f"{spec.id} night {night}: {kind} has no moment {planned_moment}"
                                 f" (its moments: {', '.join(fault.moments) or 'none'})")
            pause_moment = planned_moment
        paused_ttl = self.waits.pause_lease_ttl_seconds if fault.action == "pause" or fault.where == "retry_wait" else None
        if fault.where == "retry_wait":
            pause_moment = fault.moment
        record.paused = pause_moment
        started = time.monotonic()

        # The day: staff work, then the night's clock (the window closes `LAG` before it).
        model = partner.model
        if kind == "refused_after_quiet_outage":
            self._quiet_then_outage(env, partner, night, record)
        if night > 1 and not settle:
            model.advance_clock(timedelta(hours=20))
            partner.day_of_changes(rng, scale=max(5, self.size // 20))
        model.advance_clock(timedelta(hours=1))
        oracle = partner.snapshot()  # what the mirror must hold after this night (but `touched`)
        oracle["excused"] = set()
        if kind in ("clock_backwards", "clock_behind_cursor"):
            # The partner's clock falls back behind today's changes: the night's window closes
            # on that clock, so they are the next night's to harvest (and checked then).
            back = timedelta(minutes=rng.randint(30, 180)) if kind == "clock_backwards" else timedelta(hours=26)
            partner.records.rewind_clock(back)
            record.fired = True
        oracle["excused"] = partner.stamped_after_now()  # this night's changes too, after a rewind
        partner.touched = set()
        partner.list_requests = 0
        mid_page = rng.randint(1, 2)  # staff edit as the harvest asks for page mid_page + 1
        fault_page = rng.randint(1, 2)
        partner.full_load_night = full_load
        strains = self._host_strains()
        self._arm(partner, fault, rng, record, mid_page, fault_page)

        attempt_data: dict | None = None
        if self.scheduler:  # the scheduler retries what dies; nothing is rerun by the soak
            record.attempts = 1
            moment = (fault.scheduler_moment or fault.moment) if fault.where == "child" else ""
            attempt_data, fired = self._scheduled(partner, night, "harvest", moment, fault.action if moment else "")
            record.fired = record.fired or fired
            if moment and not fired:
                record.notes.append(f"armed at {moment}, never reached")
        else:  # dag.test(): a killed night is started again under its run id
            for attempt in range(1 + RERUNS):
                record.attempts = attempt + 1
                moment = fault.moment if fault.where == "child" and attempt == 0 else ""
                action = fault.action if moment else ""
                if attempt == 0 and pause_moment and not fault.reconcile_only:
                    moment, action = pause_moment, "pause"
                data, code = self._child(env, partner, night, "harvest", moment, action,
                                         forget=full_load and attempt == 0,
                                         lease_ttl=None if fault.reconcile_only else paused_ttl,
                                         on_stop=lambda pid: self._paused(env, partner, night, fault, rng, record,
                                                                          oracle, "harvest"))
                if fault.where == "child" and attempt == 0 and (data is None or fault.action == "pg_restart"):
                    record.fired = record.fired or data is None or fault.action == "pg_restart"
                if data is None:
                    record.notes.append(f"attempt {attempt + 1}: process ended ({'SIGKILL' if code == -signal.SIGKILL else code})")
                    partner.trip = None
                    continue
                attempt_data = data
                break
        self._disarm(partner)
        if kind == "sierra_keep_alive_poison" and self._host_strains() > strains:
            record.divergence.append(f"the host's back-off fed itself: {self._host_strains() - strains} strains in a "
                                     "night without an answer the host failed")
        if attempt_data is not None:
            record.task_retries = sum(max(0, t["tries"] - 1) for t in attempt_data["tasks"].values())
            succeeded = attempt_data["state"] == "success"
        else:
            succeeded = False
        if succeeded and attempt_data is not None:
            record.outcome = ("rerun" if record.attempts > 1 else "retried" if record.task_retries else "clean")
            self._check_cursors(record, attempt_data)
        else:
            record.outcome = "next-night"
            if attempt_data:
                failed = [t for t, v in attempt_data["tasks"].items() if v["state"] != "success"]
                record.notes.append(f"run {attempt_data['state']}: {', '.join(failed)}")

        if spec.reconciled and (night % self.reconcile_every == 0 or settle or fault.reconcile_only):
            record.reconcile = True
            moment = pause_moment if fault.reconcile_only else ""
            approval = kind == "approved_after_quiet_night"
            on_stop = ((lambda pid: self._quiet_night_in_wait(env, partner, night, record)) if approval else
                       (lambda pid: self._paused(env, partner, night, fault, rng, record, oracle, "reconcile")))
            data = (self._scheduled(partner, night, "reconcile")[0] if self.scheduler
                    else self._child(env, partner, night, "reconcile", moment, "pause" if moment else "",
                                     lease_ttl=paused_ttl if moment else None, on_stop=on_stop,
                                     extra=APPROVAL_ARGS if approval else ())[0])
            if fault.reconcile_only and data:
                record.task_retries += sum(max(0, t["tries"] - 1) for t in data["tasks"].values())
            if not data or data["state"] != "success":
                record.notes.append("reconcile failed")
        record.seconds = round(time.monotonic() - started, 1)
        self._check(partner, record, oracle, succeeded)
        self.log(self._line(record))
        return record

    # ---------------------------------------------------------------- faults
    def _arm(self, partner: Partner, fault: Fault, rng: random.Random, record: Night, mid_page: int,
             fault_page: int) -> None:
        sim = partner.sim
        steps: list[tuple[int, Any]] = [] if fault.kind == "none" else [
            (mid_page, lambda: partner.changes_during_harvest(rng))]

        def fired(fn: Callable[[], object]) -> Callable[[], None]:
            def run() -> None:
                record.fired = True
                fn()
            return run

        if fault.where == "page":
            # A pause stops the harvest before its second page (a full load's) or its first (an
            # incremental night may have one page only): it always meets its moment.
            pause_page = 1 if partner.full_load_night else 0
            do: Callable[[], None] = {
                "kill": ((lambda: self._kill_asking_task(partner, record)) if self.scheduler
                         else (lambda: os.kill(partner.stopped_pid, signal.SIGKILL))),
                "pg_restart": lambda: self._pg_restart(),
                "drop_conn": lambda: self._drop_connections(),
                "expire_tokens": lambda: partner.tokens.expire_tokens(),
                "pause": lambda: self._stop(partner, record, pause_page),
            }[fault.action]
            steps.append((pause_page if fault.action == "pause" else fault_page, fired(do)))
        elif fault.where == "retry_wait":  # the first list request fails through the try's HTTP retries
            steps.append((0, lambda: sim.fail_next(HTTP_RETRIES + 1, 500)))
        elif fault.kind == "storm_5xx":
            sim.fail_next((HTTP_RETRIES + 1) * (RETRIES + 1) + 1, 500)  # longer than every retry of the night
            record.fired = True
        elif fault.kind == "throttle_429_retry_after":
            sim.fail_next(2, 429, retry_after=1)
            record.fired = True
        elif fault.kind == "throttle_503_retry_after":
            sim.fail_next(2, 503, retry_after=1)
            record.fired = True
        elif fault.kind == "token_expired":
            partner.oai.expire_tokens_after(fault_page)
            record.fired = True
        elif fault.kind == "token_repeated":
            steps.append((fault_page, fired(lambda: partner.oai.repeat_token(True))))
        elif fault.kind == "broken_xml":
            steps.append((fault_page, fired(lambda: partner.oai.broken_next())))
        elif fault.kind == "sierra_export_138":
            partner.sierra.fail_export_next(138, 2)  # "Rate exceeded for endpoint": the harvester waits, resumes
            record.fired = True
        elif fault.kind == "sierra_export_135":
            partner.sierra.fail_export_next(135, HTTP_RETRIES + 1)  # outlasts the client's own retries: the task's
            record.fired = True
        elif fault.kind == "sierra_keep_alive_poison":
            partner.catalogue.poison_every = 40  # bibs bib2Marc cannot convert: 500/135 for every block holding one
            partner.sierra.keep_alive_timeout = 0.05  # a connection idle 50 ms is closed: every pacing wait outlasts it
            record.fired = True
        elif fault.kind == "sierra_deletion_poll_500":
            partner.sierra.fail_next((HTTP_RETRIES + 1) * 2, 500, path_prefix="deletedDate")
            record.fired = True
        elif fault.kind == "sierra_item_poll_500":  # the items' change poll fails past every retry of the night
            partner.sierra.fail_next((HTTP_RETRIES + 1) * (RETRIES + 1) * 3, 500, path_prefix="/items?deleted=false")
            record.fired = True
        steps.sort(key=lambda s: s[0])
        self._chain(partner, steps)

    def _chain(self, partner: Partner, steps: list[tuple[int, Any]]) -> None:
        """Hang the steps on successive pages (two steps on one page run together)."""
        if not steps:
            partner.trip = None
            return
        page, first = steps[0]
        rest = steps[1:]

        def do() -> None:
            first()
            while rest and rest[0][0] <= page:
                rest.pop(0)[1]()
            self._chain(partner, rest)

        partner.trip = {"page": page, "do": do}

    def _disarm(self, partner: Partner) -> None:
        sim = partner.sim
        partner.trip = None
        sim.fail_next(0)
        if partner.spec.protocol == IIIF:
            pass
        elif partner.spec.protocol == "oai-pmh":
            partner.oai.repeat_token(False)
            partner.oai.refuse_windows_longer_than(None)
        else:
            partner.sierra.set_faults(fail_export_next=None)
            partner.sierra.keep_alive_timeout = KEEP_ALIVE_TIMEOUT

    def _host_strains(self) -> int:
        """Strains recorded on the simulators' host (every soak partner is on 127.0.0.1)."""
        with psycopg.connect(self.conninfo) as conn:
            try:
                row = conn.execute("SELECT coalesce(sum(strains), 0) FROM host_pacing").fetchone()
            except psycopg.errors.UndefinedTable:  # before the first night made the schema
                return 0
        return int(row[0]) if row else 0

    def _quiet_then_outage(self, env: dict[str, str], partner: Partner, night: int, record: Night) -> None:
        """Quiet nights (nothing changed: the last fetches nothing, so the night after looks
        first), then the server is down for four nights and, back, refuses windows longer
        than a day: tonight's window has grown past that."""
        for hour in (6, 7):  # the second is quiet for certain (the first may see the last night's late edits)
            partner.model.advance_clock(timedelta(hours=1))
            self._child(env, partner, night, "harvest", tag=f"quiet{hour}",
                        logical=START + timedelta(days=night - 1, hours=hour))
        partner.model.advance_clock(timedelta(days=4))
        partner.oai.refuse_windows_longer_than(86400, "413")
        record.fired = True
        record.notes.append("two quiet nights, four nights down, windows over a day refused")

    def _quiet_night_in_wait(self, env: dict[str, str], partner: Partner, night: int, record: Night) -> None:
        """The reconcile waits at its approval gate (its process stopped): the partner's nightly
        harvest runs and changes nothing; then the soak lets the approval go on."""
        record.fired = True
        partner.model.advance_clock(timedelta(hours=1))
        second, _ = self._child(env, partner, night, "harvest", tag="quiet-in-wait",
                                logical=START + timedelta(days=night, hours=12))
        record.interloper = f"quiet harvest {second['state'] if second else 'killed'}"

    # ---------------------------------------------------------------- pauses
    def _stop(self, partner: Partner, record: Night, page: int) -> None:
        """From the simulator, as the harvest asks for a page: stop the night's process."""
        record.paused = f"page {page + 1}"
        os.kill(partner.stopped_pid, signal.SIGSTOP)

    def _paused(self, env: dict[str, str], partner: Partner, night: int, fault: Fault, rng: random.Random,
                record: Night, oracle: dict[str, Any], stopped_run: str) -> None:
        """The night's process is stopped: hold it past its lease's TTL, then let another run
        take the partner (or an operator command change it) before it goes on."""
        record.fired = True
        self._wait_until_no_live_lease(partner.spec.id)
        if fault.where == "retry_wait":
            self._command_in_retry_wait(partner, fault, rng, record)
            return
        changed = partner.changes_while_paused(rng)
        second, _ = self._child(env, partner, night, "harvest", tag="second",
                                logical=START + timedelta(days=night, hours=12))
        state = second["state"] if second else "killed"
        record.interloper = f"second harvest {state}"
        record.notes.append(f"{stopped_run} stopped at {record.paused} past its lease; {len(changed)} changed "
                            f"upstream; second harvest {state}")
        if second:
            self._check_cursors(record, second)
        # What the mirror must hold now: the partner after the changes the second run harvested.
        oracle.update(partner.snapshot())
        oracle["excused"] = partner.stamped_after_now()

    def _wait_until_no_live_lease(self, partner_id: str, timeout: float = 60.0) -> None:
        """The stopped run's lease lapses by itself (nobody renews it): wait for that state."""
        deadline = time.monotonic() + timeout
        with psycopg.connect(self.conninfo, autocommit=True) as conn:
            while scalar(conn.execute("SELECT count(*) FROM partner_leases WHERE partner_id = %s AND expires_at > now()",
                               (partner_id,))):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{partner_id}: a lease stayed live {timeout:.0f} s with its run stopped")
                time.sleep(0.05)

    def _command_in_retry_wait(self, partner: Partner, fault: Fault, rng: random.Random, record: Night) -> None:
        """``forget`` or ``reset-cursor --to`` (an earlier instant) while the run waits for its retry."""
        pid = partner.spec.id
        keys = [f"harvest_cursor__{pid}", f"harvest_cursor__{pid}__deletions"]
        argv = [fault.action, pid, "--yes"]
        if fault.action == "reset-cursor":
            high = self.cursor_high.get(keys[0])
            to = (datetime.fromisoformat(high.replace("Z", "+00:00")) if high else START) \
                - timedelta(hours=rng.randint(1, 48))
            argv += ["--to", to.strftime("%Y-%m-%dT%H:%M:%SZ")]
        code, said = self._operator(f"{pid}-{record.night}-{fault.action}", argv)
        first = next((line for line in said.splitlines() if line.startswith("epoch of the partner")), "")
        record.interloper = f"{' '.join(argv[:1] + argv[3:])}: exit {code}"
        record.notes.append(f"{fault.action} in the retry wait (stopped at {record.paused}): exit {code}" + (f"; {first[:60]}" if first else
                                                                                  f"; {said.strip()[-200:]}"))
        if code != 0:
            record.fired = False
            return
        for key in keys:  # the operator moved the cursor on purpose: backwards from here is not a fault
            self.cursor_high.pop(key, None)
        if fault.action == "forget":
            self.reported_deleted[pid + ":held"] = set()  # the mirror holds nothing of it now

    def _pg_restart(self) -> None:
        from include import embedded_pg

        embedded_pg.restart_immediately(self.pg_label, self.conninfo)

    def _drop_connections(self) -> None:
        with psycopg.connect(self.conninfo, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                          " WHERE application_name = 'partner-harvest' AND pid <> pg_backend_pid()")

    # ---------------------------------------------------------------- checks
    def _check_cursors(self, record: Night, data: dict) -> None:
        for key, value in (data.get("cursors") or {}).items():
            if not value:
                continue
            until = value["until"] if isinstance(value, dict) else str(value)
            high = self.cursor_high.get(key)
            if high and until < high:
                record.divergence.append(f"cursor {key} moved backwards: {high} -> {until}")
            self.cursor_high[key] = max(until, high or until)

    def _check(self, partner: Partner, record: Night, oracle: dict, succeeded: bool) -> None:
        spec = partner.spec
        pid = spec.id
        with psycopg.connect(self.conninfo) as conn:
            held = {i: (t, tuple(sorted(s or ()))) for i, t, s in conn.execute(
                "SELECT identifier, title, set_specs FROM records WHERE partner_id = %s", (pid,))}
            quarantined = {r[0] for r in conn.execute(
                "SELECT identifier FROM quarantine_current WHERE partner_id = %s", (pid,))}
            deletions = {r[0] for r in conn.execute(
                "SELECT identifier FROM deletions WHERE partner_id = %s", (pid,))}
            leases = conn.execute("SELECT holder, expires_at - now() FROM partner_leases WHERE partner_id = %s",
                                  (pid,)).fetchall()
            stale_staging = scalar(conn.execute(
                "SELECT count(*) FROM staging s JOIN harvest_runs h USING (partner_id, run_id, channel)"
                " WHERE s.partner_id = %s AND h.status = 'applied'", (pid,)))
            bad_counts = conn.execute(
                "SELECT run_id, channel FROM harvest_runs WHERE partner_id = %s AND status = 'applied'"
                " AND upserted + unchanged + purged + quarantined <> fetched", (pid,)).fetchall()
            attached = {kind: {i: tuple(sorted(b)) for i, b in conn.execute(
                f"SELECT identifier, bib_ids FROM {kind} WHERE partner_id = %s", (pid,))}
                for kind in oracle.get("attached", {})}
        problems = record.divergence
        for holder, left in leases:  # every run of the night has ended (a killed one > TTL ago at worst)
            if left > timedelta(0):
                problems.append(f"lease of {holder} outlives its run (expires in {left})")
        if stale_staging:
            problems.append(f"{stale_staging} staging rows of applied runs left behind")
        if bad_counts:
            problems.append(f"harvest_runs counts do not add up: {bad_counts[:3]}")
        if not succeeded:
            record.checked = "deferred"  # nothing applied; the next night must converge
            return
        excused = set(partner.touched) | oracle["excused"]
        expect = oracle["expect"]
        if spec.reconciled and not record.reconcile:
            record.checked = "awaiting-reconcile"
            ghosts = set(held) - set(expect) - excused
            upstream_deleted = oracle["deleted"]
            unexplained = {g for g in ghosts if g not in upstream_deleted and g not in oracle["invalid"]}
            if unexplained:
                problems.append(f"{len(unexplained)} held but never deleted upstream: {sorted(unexplained)[:3]}")
        else:
            record.checked = "strict"
            extra = set(held) - set(expect) - excused
            if extra:
                problems.append(f"{len(extra)} held but not live upstream: {sorted(extra)[:3]}")
            # every upstream deletion of a record we held is in `deletions`
            gone = (oracle["deleted"] - excused) & self.reported_deleted.get(pid + ":held", set())
            missing_del = gone - deletions
            if missing_del:
                problems.append(f"{len(missing_del)} upstream deletions not in deletions: {sorted(missing_del)[:3]}")
        missing = set(expect) - set(held) - excused
        if missing:
            problems.append(f"{len(missing)} live upstream but missing: {sorted(missing)[:3]}")
        stale = [i for i in set(expect) & set(held) - excused if not _same(spec, held[i], expect[i])]
        if stale:
            i = sorted(stale)[0]
            problems.append(f"{len(stale)} with stale content, e.g. {i}: held {held[i]!r}, partner {expect[i]!r}")
        invalid = oracle["invalid"] - excused
        if invalid - quarantined:
            problems.append(f"{len(invalid - quarantined)} invalid records not quarantined")
        if invalid & set(held):
            problems.append(f"{len(invalid & set(held))} invalid records held as valid")
        wrongly = (quarantined & set(expect)) - excused
        if wrongly:
            problems.append(f"{len(wrongly)} valid records quarantined: {sorted(wrongly)[:3]}")
        for kind, live in oracle.get("attached", {}).items():  # items, holdings: exactly the public live set
            if attached[kind] != live:
                wrong = sorted(set(attached[kind]) ^ set(live)) or sorted(
                    i for i in live if attached[kind].get(i) != live[i])
                problems.append(f"{kind}: {len(wrong)} differ from the live set, e.g. {wrong[:3]}")
        self.reported_deleted[pid + ":held"] = set(held)

    @staticmethod
    def _line(r: Night) -> str:
        status = "DIVERGED " + "; ".join(r.divergence) if r.divergence else "ok"
        return (f"{r.partner:18} night {r.night:2}  {r.fault:31} fired={'y' if r.fired else 'n'} "
                f"{r.outcome:10} attempts={r.attempts} retries={r.task_retries} {r.checked:18} "
                f"{r.seconds:5.1f}s  {status}{'  [' + '; '.join(r.notes) + ']' if r.notes else ''}")


def _same(spec: PartnerSpec, held: tuple, expect: tuple) -> bool:
    title, sets = held
    want_title, want_sets = expect
    if spec.protocol == "sierra":
        return (title or "").strip(" /:;.,") == want_title.strip(" /:;.,")
    return title == want_title and sets == want_sets


def per_kind_plan(partners: list[str], known_gaps: bool = False, scheduler: bool = False) -> dict[tuple[str, int], str]:
    """Every fault kind once across the partners, each on a night it can meet: the export's
    faults on a Sierra full load (night 1), the deletion poll's and a clock jump on later
    nights, a reconcile's pause on a partner with a reconcile; gaps left by those rules are
    quiet nights ("none"). ``scheduler``: only the kinds --scheduler nights can meet."""
    from benchmarks.soak.faults import FAULTS

    specs = [PARTNERS[p] for p in partners]
    plan: dict[tuple[str, int], str] = {}
    used = {s.id: 0 for s in specs}
    kinds = sorted(k for k, f in FAULTS.items() if (known_gaps or not f.known_gap)
                   and not (scheduler and f.dag_test_only))
    # The export's faults need a night 1 (a full load); a page's faults want one too: an
    # incremental night may have fewer pages than the fault's page, and never fire (a
    # pause at a page stops the first one on such a night).
    kinds.sort(key=lambda k: (not FAULTS[k].full_load_only, FAULTS[k].where != "page" or FAULTS[k].action == "pause"))

    def fits(kind: str, night: int) -> bool:
        f = FAULTS[kind]
        if f.full_load_only:
            return night == 1
        return night > 1 or not (f.incremental_only or f.where == "before")

    for kind in kinds:
        candidates = sorted((s for s in specs if s.protocol in FAULTS[kind].protocols
                             and (s.reconciled or not FAULTS[kind].reconcile_only)
                             and (s.items or not FAULTS[kind].items_only)),
                            key=lambda s: (used[s.id], specs.index(s)))
        if not candidates:
            continue
        spec = next((s for s in candidates if fits(kind, used[s.id] + 1)), candidates[0])
        night = used[spec.id] + 1
        while not fits(kind, night) and night < 3:
            plan[(spec.id, night)] = "none"
            night += 1
        if fits(kind, night):
            plan[(spec.id, night)] = kind
            used[spec.id] = night
    return plan


def summary(results: list[Night], seed: int) -> str:
    """The soak's table: nights, faults by kind, retries and reruns, divergences, slowest recovery."""
    by_kind: dict[str, Counter] = {}
    for r in results:
        c = by_kind.setdefault(r.fault, Counter())
        c["nights"] += 1
        c["fired"] += r.fired
        c[r.outcome] += 1
        c["retries"] += r.task_retries
        c["reruns"] += r.attempts - 1
        c["diverged"] += bool(r.divergence)
    lines = [f"seed {seed}: {len(results)} nights, "
             f"{len({r.partner for r in results})} partners, divergent nights: {sum(bool(r.divergence) for r in results)}",
             "| fault | nights | fired | clean | retried | rerun | next night | task retries | reruns | divergent |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for kind in sorted(by_kind):
        c = by_kind[kind]
        lines.append(f"| {kind} | {c['nights']} | {c['fired']} | {c['clean']} | {c['retried']} | {c['rerun']} |"
                     f" {c['next-night']} | {c['retries']} | {c['reruns']} | {c['diverged']} |")
    slow = max(results, key=lambda r: r.seconds) if results else None
    if slow:
        lines.append(f"slowest recovery within a night: {slow.partner} night {slow.night} ({slow.fault}, "
                     f"{slow.outcome}) {slow.seconds}s wall")
    longest, where, streak = 0, "", 0
    for r in results:  # nights in a row a partner's run applied nothing (converged by the one after)
        streak = streak + 1 if r.outcome == "next-night" else 0
        if streak > longest:
            longest, where = streak, f"{r.partner} from night {r.night - streak + 1}"
    lines.append(f"longest wait for the next night: {longest} night(s)" + (f" ({where})" if where else ""))
    unfired = [r for r in results if r.fault != "none" and not r.fired]
    if unfired:
        lines.append("faults that never fired (the night had no such moment): "
                     + ", ".join(f"{r.partner}#{r.night} {r.fault}" for r in unfired))
    deferred = [r for r in results if r.outcome == "next-night"]
    lines.append(f"nights left to the next night: {len(deferred)}"
                 + (f" ({', '.join(f'{r.partner}#{r.night} {r.fault}' for r in deferred)})" if deferred else ""))
    return "\n".join(lines)
