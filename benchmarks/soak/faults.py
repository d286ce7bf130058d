"""The faults a soak night can meet, and where each one is armed.

A fault is armed in one of three places: at the partner (a simulator switch), at a page
(a tripwire the soak hangs on the simulator: when the harvest asks for page k+1, the
soak kills the night's process, stops it with SIGSTOP, restarts PostgreSQL or drops the
harvester's connections before answering), or inside the night's process (an Airflow
listener, the lease's taking, the apply's or the reconcile's transaction; see night.py).

Pauses: the night's process is stopped with a real SIGSTOP at a task boundary
(``where="pause"``, one of ``moments``, drawn per night) or between two pages, and held
until its lease has lapsed; meanwhile another run takes the partner (a second harvest,
after upstream changes the paused run cannot have seen), then SIGCONT. An operator
command (``where="retry_wait"``) is issued while the run waits between two tries. The
oracle then wants the mirror to equal the partner, as after every night.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Fault:
    kind: str
    protocols: tuple[str, ...]  # "oai-pmh", "sierra", "iiif-change-discovery"
    where: str  # "page" | "child" | "partner" | "before" | "pause" | "retry_wait" | "approval"
    moment: str = ""  # child: running:<task> | success:<task> | apply:audit
    action: str = ""  # page/child: kill | pg_restart | drop_conn
    full_load_only: bool = False  # only a full load meets it (Sierra's export)
    incremental_only: bool = False
    known_gap: bool = False  # diverges on today's code: drawn only with --known-gaps
    # --scheduler nights: the moment in the real task processes, when it differs. A task
    # process reports success before its success listeners run, so a kill there ends a
    # finished task; the same point "between" two tasks is the next task's start, which
    # the scheduler then retries.
    scheduler_moment: str = ""
    # pauses: the moments one is drawn from (night.py's moments: between two tasks, or inside
    # the next one holding its lease); reconcile_only: the night's reconcile meets it.
    moments: tuple[str, ...] = ()
    reconcile_only: bool = False
    dag_test_only: bool = False  # not on --scheduler nights (their task processes are the scheduler's)
    items_only: bool = False  # only a partner with items and holdings meets it


BOTH = ("oai-pmh", "sierra")
OAI = ("oai-pmh",)
SIERRA = ("sierra",)
IIIF = "iiif-change-discovery"
ALL = (*BOTH, IIIF)  # a stream has no partner clock of its own to set back: the clock faults are BOTH's

FAULTS: dict[str, Fault] = {f.kind: f for f in (
    Fault("kill_mid_page", ALL, "page", action="kill"),
    Fault("kill_between_harvest_and_apply", ALL, "child", "success:harvest_changes", "kill",
          scheduler_moment="running:apply_changes"),
    Fault("kill_mid_apply", ALL, "child", "apply:audit", "kill"),
    Fault("kill_after_apply_before_cursor", ALL, "child", "success:apply_changes", "kill",
          scheduler_moment="running:advance_cursor"),
    Fault("pg_restart_mid_page", ALL, "page", action="pg_restart"),
    Fault("pg_restart_before_apply", ALL, "child", "running:apply_changes", "pg_restart"),
    Fault("pg_restart_mid_apply", ALL, "child", "apply:audit", "pg_restart"),
    Fault("drop_conn_mid_copy", ALL, "page", action="drop_conn"),
    Fault("storm_5xx", ALL, "partner"),
    Fault("throttle_429_retry_after", (*OAI, IIIF), "partner"),
    Fault("throttle_503_retry_after", (*OAI, IIIF), "partner"),
    Fault("token_expired", OAI, "partner"),
    Fault("token_repeated", OAI, "partner"),
    Fault("broken_xml", OAI, "partner"),
    Fault("clock_backwards", BOTH, "before"),  # by 30 min to 3 h: still ahead of our cursor
    Fault("clock_behind_cursor", BOTH, "before"),  # by 26 h: behind our cursor
    Fault("sierra_401_mid_run", SIERRA, "page", action="expire_tokens"),
    Fault("sierra_export_138", SIERRA, "partner", full_load_only=True),
    Fault("sierra_export_135", SIERRA, "partner", full_load_only=True),
    Fault("sierra_deletion_poll_500", SIERRA, "partner", incremental_only=True),
    # The items' change poll answers 500 past every retry: the night fails with nothing applied
    # (bibs neither), no cursor moves, and the next night brings the items in.
    Fault("sierra_item_poll_500", SIERRA, "partner", incremental_only=True, items_only=True),
    # Pauses past the lease's TTL at each boundary of a run, a second harvest in between.
    Fault("pause_after_freeze", ALL, "pause", action="pause", dag_test_only=True,
          moments=("success:freeze_window", "lease:plan_slices")),
    Fault("pause_mid_page", ALL, "page", action="pause", dag_test_only=True),
    Fault("pause_before_apply", ALL, "pause", action="pause", dag_test_only=True,
          moments=("running:apply_changes", "lease:apply_changes")),
    Fault("pause_before_cursor", ALL, "pause", action="pause", dag_test_only=True,
          moments=("success:apply_changes", "lease:advance_cursor")),
    Fault("pause_reconcile_before_removals", OAI, "pause", action="pause", dag_test_only=True,
          reconcile_only=True, moments=("reconcile:removals", "reconcile:apply")),
    # An operator command while the run waits for its retry (its first try failed).
    # A quiet partner's server, down for four nights, then refusing windows longer than a day:
    # the night's quiet-night look asks for the whole grown window (a quiet night ran first).
    Fault("refused_after_quiet_outage", OAI, "before", incremental_only=True, dag_test_only=True),
    # The reconcile's purge waits at its approval gate (its limit lowered for the night); the
    # partner's quiet nightly harvest applies during the wait, then a person approves.
    Fault("approved_after_quiet_night", OAI, "approval", reconcile_only=True, dag_test_only=True),
    # A full load against a server closing idle keep-alive connections at once, with poison
    # bibs (500/135 from bibs/marc): the host's back-off must not feed itself.
    Fault("sierra_keep_alive_poison", SIERRA, "partner", full_load_only=True),
    Fault("forget_in_retry_wait", ALL, "retry_wait", "failed:*", "forget", incremental_only=True,
          dag_test_only=True),
    Fault("reset_cursor_in_retry_wait", ALL, "retry_wait", "failed:*", "reset-cursor", incremental_only=True,
          dag_test_only=True),
)}
PAUSES = tuple(k for k, f in FAULTS.items() if f.action == "pause" or f.where == "retry_wait")
NONE = Fault("none", ALL, "none")  # a settling night: no fault


def fault(kind: str) -> Fault:
    return NONE if kind == "none" else FAULTS[kind]


def applicable(protocol: str, full_load: bool, known_gaps: bool = False, reconciled: bool = False,
               scheduler: bool = False, only: tuple[str, ...] = (), items: bool = False) -> list[str]:
    """Fault kinds that can meet a night of this protocol (sorted, for determinism).

    ``reconciled``: the partner has a reconcile (a reconcile-only fault makes its night a
    reconcile night); ``only``: draw from these kinds alone (``--only``); ``items``: the
    partner has items and holdings."""
    return sorted(k for k, f in FAULTS.items() if protocol in f.protocols and (known_gaps or not f.known_gap)
                  and not (f.full_load_only and not full_load) and not (f.incremental_only and full_load)
                  and not (f.reconcile_only and not reconciled) and not (f.dag_test_only and scheduler)
                  and not (f.items_only and not items) and (not only or k in only))
