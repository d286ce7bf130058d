"""One night of one partner: its DAG run through ``dag.test()``, in a process of its own.

The soak runs every night in a child process so that a fault can SIGKILL it, as the OOM
killer or a lost node kills a worker, without killing the soak. Faults that belong inside
the task process are armed here: an Airflow listener (or, mid-apply, a wrapper round the
apply's audit step, inside its open transaction) kills this process, restarts the
PostgreSQL server, or stops this process with a real SIGSTOP (``pause``: every thread,
the lease's renewal thread too, until the soak sends SIGCONT), at the named moment.
Everything else happens at the partner's end.

The result (task states and tries, cursors) goes to ``--result`` as JSON; a killed
night writes none.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any
from unittest import mock

ROOT = Path(__file__).resolve().parents[2]
for _path in (str(ROOT), str(ROOT / "plugins")):
    if _path not in sys.path:
        sys.path.insert(0, _path)


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _act(action: str, pg_label: str) -> None:
    if action == "kill":
        _die()
    elif action == "pause":
        # The whole process stops here; its parent (the zygote, waiting with WUNTRACED)
        # tells the soak, which lets the lease lapse, works the partner and sends SIGCONT.
        os.kill(os.getpid(), signal.SIGSTOP)
    elif action == "pg_restart":
        from include import embedded_pg

        embedded_pg.restart_immediately(pg_label)


def _workaround_deadline_alerts() -> None:
    """apache/airflow#73428 (3.3.2): dag.test() of a DAG with a deadline crashes after the
    run; decode the alert as the scheduler's lookup would (as tests/dags/conftest.py does)."""
    from airflow.models.deadline_alert import DeadlineAlert as DeadlineAlertModel

    original = DeadlineAlertModel.get_by_id

    def get_by_id(deadline_alert_id: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(deadline_alert_id, dict):
            data = deadline_alert_id.get("__var", deadline_alert_id)
            reference = SimpleNamespace(reference=data["reference"])
            reference_class = vars(DeadlineAlertModel)["reference_class"]  # the property itself
            return SimpleNamespace(reference_class=reference_class.fget(reference))
        return original(deadline_alert_id, *args, **kwargs)

    mock.patch.object(DeadlineAlertModel, "get_by_id", get_by_id).start()  # for the night's process


def _once(action: str, pg_label: str) -> Callable[[], None]:
    """``action`` the first time only: Airflow's retry of the task meets no fault."""
    fired: list[bool] = []

    def act() -> None:
        if not fired:
            fired.append(True)
            _act(action, pg_label)

    return act


def _wrap(module: ModuleType, name: str, act: Callable[[], None]) -> None:
    """``module.name`` acts first, once, then does what it did."""
    original = getattr(module, name)

    def acting(*args: Any, **kwargs: Any) -> Any:
        setattr(module, name, original)
        act()
        return original(*args, **kwargs)

    setattr(module, name, acting)


def _arm(moment: str, action: str, pg_label: str) -> None:
    """Where a fault meets the night's process:

    - ``running:<task>`` / ``success:<task>``: an Airflow listener, as the task starts or
      after it ended (between two tasks: no lease is being renewed);
    - ``failed:<task>`` / ``failed:*``: the first failed try (``up_for_retry``: the run
      waits between tries, holding no live lease once its TTL passed);
    - ``lease:<task>``: inside the task, the moment its lease is taken, before its first
      write (the lease's renewal thread runs: a pause freezes it);
    - ``apply:audit``: inside the apply's transaction, after its upsert and purge, before
      its audit and commit;
    - ``reconcile:removals`` / ``reconcile:apply``: inside the reconcile's task, after its
      sweep and verification, before its removals are staged / before they are applied.
    """
    act = _once(action, pg_label)
    if moment == "apply:audit":
        from partner_harvest.store import apply

        _wrap(apply, "_audit", act)
        return
    if moment == "reconcile:removals":
        from partner_harvest.store import reconcile as reconcile_sql

        _wrap(reconcile_sql, "stage_removals", act)
        return
    if moment == "reconcile:apply":
        from partner_harvest import reconcile

        _wrap(reconcile, "apply_run", act)
        return
    when, task_id = moment.split(":", 1)
    from airflow.listeners import hookimpl
    from airflow.sdk.listener import get_listener_manager

    if when == "lease":
        from partner_harvest.store import leases

        enter = leases.LeaseKeeper.__enter__
        running: list[str] = []

        def enter_then_act(self: leases.LeaseKeeper) -> leases.LeaseKeeper:
            keeper = enter(self)
            if running and running[-1] == task_id:
                act()
            return keeper

        mock.patch.object(leases.LeaseKeeper, "__enter__", enter_then_act).start()  # for the night's process

    class Trip:
        def _maybe(self, ti: Any) -> None:
            if task_id in ("*", ti.task_id):
                act()

        if when == "lease":
            @hookimpl
            def on_task_instance_running(self, previous_state: Any, task_instance: Any) -> None:
                running.append(task_instance.task_id)
        elif when == "running":
            @hookimpl
            def on_task_instance_running(self, previous_state: Any, task_instance: Any) -> None:
                self._maybe(task_instance)
        elif when == "failed":
            @hookimpl
            def on_task_instance_failed(self, previous_state: Any, task_instance: Any, error: Any) -> None:
                self._maybe(task_instance)
        else:
            @hookimpl
            def on_task_instance_success(self, previous_state: Any, task_instance: Any) -> None:
                self._maybe(task_instance)

    get_listener_manager().add_listener(Trip())


def _purge_limit(partner_id: str, fraction: float) -> None:
    """This process's registry: a copy with the partner's max_purge_fraction set (every task
    of the run reads the registry again, so the copy is what they all see)."""
    import tempfile

    import yaml

    from partner_harvest.registry import PARTNERS_FILE_ENV, partners_file

    registry = yaml.safe_load(partners_file().read_text(encoding="utf-8"))
    for entry in registry["partners"]:
        if entry.get("id") == partner_id:
            entry["max_purge_fraction"] = fraction
    copy = Path(tempfile.mkdtemp(prefix="soak-registry-")) / "partners.yaml"
    copy.write_text(yaml.safe_dump(registry, sort_keys=False), encoding="utf-8")
    os.environ[PARTNERS_FILE_ENV] = str(copy)


def stop_between_polls(loop: Callable[..., Any], requested: threading.Event, resumed: threading.Event,
                       reached_within: float = 120.0) -> None:
    """Once ``requested`` is set, stop this process (SIGSTOP) in the next ``time.sleep``
    that ``loop`` itself calls, then set ``resumed`` (after the soak's SIGCONT).
    ``dag.test()``'s loop sleeps between its polls with every metadata transaction
    committed: a night stopped anywhere else may hold SQLite's write lock, and every other
    night's write then fails ("database is locked") until it goes on. No such sleep within
    ``reached_within`` seconds of the request: the process ends (exit 70) and says why,
    rather than stopping unsafely."""
    code = inspect.unwrap(loop).__code__
    real_sleep = time.sleep
    reached = threading.Event()

    def sleep(seconds: float) -> None:
        if requested.is_set() and not reached.is_set() and sys._getframe(1).f_code is code:
            reached.set()
            os.kill(os.getpid(), signal.SIGSTOP)
            resumed.set()
        real_sleep(seconds)

    def watch() -> None:
        requested.wait()
        if not reached.wait(reached_within):
            print(f"soak: {loop.__qualname__} did not sleep within {reached_within:.0f} s of the stop's"
                  " request: no safe point to stop at", file=sys.stderr, flush=True)
            os._exit(70)

    mock.patch.object(time, "sleep", sleep).start()  # for the night's process
    threading.Thread(target=watch, name="soak-stop-watch", daemon=True).start()


def _approve_after_a_stop(task_id: str = "approval_gate") -> None:
    """When the run's approval gate waits for input: stop this process between two of
    ``dag.test()``'s polls (the soak runs the partner's nightly harvest meanwhile, then sends
    SIGCONT), then answer Approve as the REST API does."""
    from airflow.sdk import DAG

    requested, resumed = threading.Event(), threading.Event()
    stop_between_polls(DAG.test, requested, resumed)

    def approve() -> None:
        from airflow.models.taskinstance import TaskInstance
        from airflow.utils.session import create_session
        from airflow.utils.state import TaskInstanceState
        from sqlalchemy import select

        from tests.support.hitl import Responder

        while True:
            with create_session() as session:
                waiting = session.scalar(select(TaskInstance.id).where(
                    TaskInstance.task_id == task_id, TaskInstance.state == TaskInstanceState.AWAITING_INPUT))
            if waiting is not None:
                break
            time.sleep(0.2)
        requested.set()
        resumed.wait()
        Responder(task_id, "Approve", user="soak")._answer()

    threading.Thread(target=approve, name="soak-approve", daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--partner", required=True)
    parser.add_argument("--kind", choices=("harvest", "reconcile"), default="harvest")
    parser.add_argument("--logical", required=True, help="logical date (ISO); one per night")
    parser.add_argument("--retries", type=int, default=2)
    parser.add_argument("--retry-delay", type=float, default=1.0, help="seconds before a task's retry")
    parser.add_argument("--moment", default="", help="running: | success: | failed: | lease:<task>, apply:audit,"
                        " reconcile:removals | reconcile:apply")
    parser.add_argument("--action", default="", choices=("", "kill", "pg_restart", "pause"))
    parser.add_argument("--pg-label", default="test")
    parser.add_argument("--forget-cursors", action="store_true", help="night 1: no cursor yet")
    parser.add_argument("--lease-ttl", type=float, default=None,
                        help="seconds: this run's lease TTL (a run the soak stops; default: the environment's)")
    parser.add_argument("--max-purge-fraction", type=float, default=None,
                        help="this run's partner with another max_purge_fraction (a reconcile made to ask)")
    parser.add_argument("--approve-after-stop", action="store_true",
                        help="when the approval gate waits: stop this process (SIGSTOP), then Approve")
    parser.add_argument("--result", required=True)
    args = parser.parse_args(argv)

    from airflow.models import Variable

    from partner_harvest.airflow.dag_factory import build_harvest_dag, build_reconcile_dag
    from partner_harvest.registry import get_partner

    if args.max_purge_fraction is not None:
        _purge_limit(args.partner, args.max_purge_fraction)
    if args.approve_after_stop:
        _approve_after_a_stop()

    partner = get_partner(args.partner)
    keys = [partner.cursor_key, f"{partner.cursor_key}__deletions"]
    if args.forget_cursors:
        for key in keys:
            Variable.delete(key)
    _workaround_deadline_alerts()
    if args.lease_ttl is not None:
        from partner_harvest.airflow import tasks

        tasks.LEASE_TTL = timedelta(seconds=args.lease_ttl)
    if args.moment and args.action:
        _arm(args.moment, args.action, args.pg_label)
    dag = (build_harvest_dag if args.kind == "harvest" else build_reconcile_dag)(partner)
    for task in dag.tasks:  # Airflow's own retries, with delays fit for a soak
        task.retries = args.retries
        task.retry_delay = timedelta(seconds=args.retry_delay)
        task.retry_exponential_backoff = 0
    logical = datetime.fromisoformat(args.logical)
    run = dag.test(run_after=logical, logical_date=logical)
    tis = run.get_task_instances()
    result = {
        "run_id": run.run_id, "dag_id": run.dag_id,
        "state": str(getattr(run.state, "value", run.state)),
        "tasks": {ti.task_id: {"state": str(getattr(ti.state, "value", ti.state)), "tries": ti.try_number}
                  for ti in tis},
        "cursors": {key: Variable.get(key, default_var=None, deserialize_json=True) for key in keys},
    }
    Path(args.result).write_text(json.dumps(result, default=str))
    return 0


def operator_command(argv: list[str]) -> int:
    """An operator's ``partner-harvest`` command, in a process of its own (the real CLI),
    talking to Airflow's REST API as it would (served here: the soak runs no api-server)."""
    from partner_harvest.airflow import api
    from partner_harvest.cli import main as cli
    from tests.support.airflow_stack import airflow_rest_api

    with airflow_rest_api() as url:
        os.environ[api.URL_ENV] = url
        return cli(argv)


def zygote() -> int:
    """Warm Airflow once (imports, the in-process execution API: ~20 s on a busy machine),
    then fork one process per night. Reads one JSON line per order from stdin:

    - ``{"argv": [...], "log": path}`` (a night; ``"cli": true``: an operator command):
      answers ``{"pid": n}`` at once, then ``{"exit": code}`` when that process ended
      (-9: SIGKILL) or ``{"stopped": n}`` when it was stopped (SIGSTOP);
    - ``{"wait": n}``, after the soak sent a stopped process SIGCONT: the same answers.

    While one night's process is stopped, the soak may fork others (a second harvest, an
    operator command) before it sends the stopped one SIGCONT."""
    import traceback

    proto = os.fdopen(os.dup(1), "w")  # the protocol keeps the pipe; everything logged goes to stderr
    os.dup2(2, 1)

    import asyncio

    import httpx
    from airflow.sdk.execution_time.supervisor import in_process_api_server

    import partner_harvest.airflow.dag_factory  # noqa: F401
    import partner_harvest.airflow.tasks  # noqa: F401
    import partner_harvest.cli  # noqa: F401

    api = in_process_api_server()

    async def first_request() -> None:  # its first request builds the versioned routes (~10 s)
        async with httpx.AsyncClient(transport=api.atransport, base_url="http://in-process.invalid") as client:
            await client.get("/execution/health")

    asyncio.run(first_request())  # no thread survives it: the fork below copies a quiet process
    print(json.dumps({"ready": True}), file=proto, flush=True)

    def report(pid: int) -> None:
        _, status = os.waitpid(pid, os.WUNTRACED)
        if os.WIFSTOPPED(status):
            print(json.dumps({"stopped": pid}), file=proto, flush=True)
        else:
            print(json.dumps({"exit": os.waitstatus_to_exitcode(status)}), file=proto, flush=True)

    for line in sys.stdin:
        order = json.loads(line)
        if "wait" in order:
            report(int(order["wait"]))
            continue
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                proto.close()
                fd = os.open(order["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
                os.dup2(fd, 1)
                os.dup2(fd, 2)
                devnull = os.open(os.devnull, os.O_RDONLY)
                os.dup2(devnull, 0)  # the orders are the zygote's, never a child's
                from airflow import settings

                if settings.engine is not None:
                    settings.engine.dispose(close=False)  # never share the zygote's connections
                code = operator_command(order["argv"]) if order.get("cli") else main(order["argv"])
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        print(json.dumps({"pid": pid}), file=proto, flush=True)
        report(pid)
    return 0


if __name__ == "__main__":
    sys.exit(zygote() if sys.argv[1:] == ["--zygote"] else main())
