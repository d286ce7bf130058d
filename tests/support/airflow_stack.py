"""One starter of a real Airflow on loopback: api-server, scheduler, dag-processor (and the
triggerer when asked), LocalExecutor, its metadata database on PostgreSQL.

Shared by the end-to-end tests (tests/support/e2e_stack.py), the soak's ``--scheduler``
nights (benchmarks/soak/scheduler.py) and the local UI (scripts/airflow_ui.py). What
differs between them is a parameter of :func:`airflow_settings`, named for why:

- ``triggered_only``: tests and the soak trigger every run themselves (no cron run races
  them for a cursor; a new DAG starts unpaused); the local UI keeps the schedules.
- ``timing``: how fast the services react (:data:`QUICK` for tests, :data:`SOAK` parses the
  DAG files once, :data:`RELAXED` for a UI left running).
- ``keys``: fresh per stack, or kept in AIRFLOW_HOME (:meth:`Keys.kept_in`) so a restarted UI
  reads what it wrote.
- ``log_ports``: free ports, or the UI's documented ``port + 1``, ``port + 2``.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import psycopg
import requests
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ("api-server", "scheduler", "dag-processor")
TRIGGERER = "triggerer"
STOP_TIMEOUT = 20.0  # for all services, after SIGTERM, before SIGKILL
DISCARD_WAIT = 2.0  # a test's stack, discarded with its databases: no graceful shutdown worth waiting for
# Environment a developer's shell (or an earlier test) may carry that must not reach a stack.
FOREIGN_SETTINGS = ("AIRFLOW__", "AIRFLOW_CONN_", "AIRFLOW_VAR_", "HARVEST_")
T = TypeVar("T")


# ---------------------------------------------------------------------- small helpers
def free_loopback_port() -> int:
    """A port free on 127.0.0.1 right now (the OS picks it; a tiny reuse race is accepted)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def three_free_ports() -> int:
    """A port p with p, p+1 and p+2 free on 127.0.0.1 (the UI's api-server and its two log servers)."""
    for _ in range(50):
        port = free_loopback_port()
        if port + 2 > 65535:
            continue
        try:
            for offset in (1, 2):
                with socket.socket() as other:
                    other.bind(("127.0.0.1", port + offset))
        except OSError:
            continue
        return port
    raise RuntimeError("no three consecutive free loopback ports")


def poll(probe: Callable[[], T | None], timeout: float, what: str, interval: float = 0.5,
         diagnostics: Callable[[], str] | None = None) -> T:
    """Call ``probe`` until it returns something truthy; fail naming ``what`` at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        result = probe()
        if result:
            return result
        if time.monotonic() >= deadline:
            extra = f"\n{diagnostics()}" if diagnostics else ""
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}{extra}")
        time.sleep(interval)


@contextmanager
def airflow_rest_api() -> Iterator[str]:
    """Airflow's REST API (the api-server's core app) on a loopback port in this process, over
    the metadata database this process is configured for; everyone is an admin. What the
    command line talks to where no api-server runs (``dag.test`` tests, the soak's operator)."""
    import threading

    import uvicorn

    saved = os.environ.get("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS")
    os.environ["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS"] = "True"
    from airflow.api_fastapi.app import create_app

    port = free_loopback_port()
    server = uvicorn.Server(uvicorn.Config(create_app("core"), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, name="airflow-api", daemon=True)
    thread.start()
    try:
        poll(lambda: server.started, 60, "the in-process Airflow API to listen", interval=0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        if saved is None:
            os.environ.pop("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS", None)
        else:
            os.environ["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS"] = saved


def wait_for(probe: Callable[[], T | None], timeout: float, what: str, proc: subprocess.Popen, log: Path) -> T:
    """``poll`` for a script this process started: fail at once, with its output, when it exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the script exited ({proc.returncode}) before {what}:\n{log.read_text()[-3000:]}")
        result = probe()
        if result:
            return result
        time.sleep(0.25)  # polls an observable condition (a log line, an API answer)
    raise AssertionError(f"timed out waiting for {what}:\n{log.read_text()[-3000:]}")


def database_conninfo(server_uri: str, name: str) -> str:
    params = conninfo_to_dict(server_uri)
    params["dbname"] = name
    return make_conninfo("", **params)


def create_database(server_uri: str, name: str, template: str | None = None, *, keep: bool = False) -> str:
    """A new, empty database (or a copy of ``template``, which nobody may be connected to);
    with ``keep``, an existing one of that name is kept as it is (the local UI's)."""
    with psycopg.connect(server_uri, autocommit=True) as admin:
        exists = admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
        if not (keep and exists):
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
            if template:
                admin.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                    sql.Identifier(name), sql.Identifier(template)))
            else:
                admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return database_conninfo(server_uri, name)


def drop_database(server_uri: str, name: str) -> None:
    with psycopg.connect(server_uri, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def sqlalchemy_url(conninfo: str) -> str:
    """Airflow's metadata URL as Airflow documents it (psycopg2; Airflow derives its async twin with
    asyncpg); a socket directory host goes in the query string (``?host=/dir``)."""
    from sqlalchemy.engine import URL

    p = {key: str(value) for key, value in conninfo_to_dict(conninfo).items() if value is not None}
    host = p.get("host") or None
    socket_dir = host if host and host.startswith("/") else None
    return URL.create(
        "postgresql+psycopg2", username=p.get("user") or None, password=p.get("password") or None,
        host=None if socket_dir else host, port=int(p["port"]) if p.get("port") else None,
        database=p["dbname"], query={"host": socket_dir} if socket_dir else {},
    ).render_as_string(hide_password=False)


def postgres_connection(conninfo: str) -> str:
    """An Airflow Connection (JSON, for ``AIRFLOW_CONN_*``) to the database ``conninfo`` names."""
    p = conninfo_to_dict(conninfo)
    return json.dumps({"conn_type": "postgres", "host": p.get("host"), "port": int(p.get("port") or 5432),
                       "login": p.get("user"), "password": p.get("password") or None, "schema": p["dbname"]})


def http_connection(url: str, login: str | None = None, password: str | None = None) -> str:
    """An Airflow Connection (JSON) to a partner endpoint."""
    value: dict[str, Any] = {"conn_type": "http", "host": url}
    if login is not None:
        value.update({"login": login, "password": password})
    return json.dumps(value)


def clean_environ(environ: dict[str, str] | None = None, strip: tuple[str, ...] = FOREIGN_SETTINGS) -> dict[str, str]:
    """``environ`` (this process's by default) without the settings a stack sets itself."""
    return {k: v for k, v in (os.environ if environ is None else environ).items() if not k.startswith(strip)}


def signal_group(proc: subprocess.Popen, sig: signal.Signals) -> None:
    """Signal the process group of a process a stack started (it leads its group)."""
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def stop_groups(processes: Iterable[subprocess.Popen], wait: float = STOP_TIMEOUT) -> None:
    """SIGTERM every process group at once (its workers too); SIGKILL what outlives ``wait``."""
    processes = list(processes)
    for proc in processes:
        if proc.poll() is None:
            signal_group(proc, signal.SIGTERM)
    deadline = time.monotonic() + wait
    for proc in processes:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for proc in processes:  # children (task runners, uvicorn workers) may outlive their parent
        signal_group(proc, signal.SIGKILL)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass


def log_event(line: str) -> str:
    """A task log line is JSON; keep what a reader needs (level, event, error detail)."""
    try:
        record = json.loads(line)
    except ValueError:
        return line
    if not isinstance(record, dict):
        return line
    text = f"{record.get('level', '?'):>7} {record.get('event', '')}"
    for error in record.get("error_detail") or []:  # the exception chain, without frames
        if isinstance(error, dict):
            text += f"\n        {error.get('exc_type')}: {error.get('exc_value')}"
    return text


def task_log_tails(home: Path, count: int = 4, lines: int = 25) -> str:
    """The most recently written task logs under ``home`` (level and event only): where a task says why."""
    logs = sorted((home / "logs").rglob("attempt=*.log"), key=lambda p: p.stat().st_mtime)
    parts = []
    for path in logs[-count:]:
        text = [log_event(line) for line in path.read_text(errors="replace").splitlines()[-lines:]]
        parts.append(f"--- {path.relative_to(home) if path.is_relative_to(home) else path}:\n" + "\n".join(text))
    return "\n".join(parts)


# ---------------------------------------------------------------------- settings
@dataclass(frozen=True)
class Keys:
    """The secrets every service of one stack shares (Fernet, the JWT the scheduler signs for
    task runners, the api-server's session key)."""

    fernet: str
    jwt: str
    api: str

    @classmethod
    def fresh(cls) -> Keys:
        from cryptography.fernet import Fernet

        return cls(Fernet.generate_key().decode(), secrets.token_urlsafe(32), secrets.token_urlsafe(32))

    @classmethod
    def kept_in(cls, home: Path) -> Keys:
        """Kept in ``home/ui-secrets.json`` (mode 600), so a restart can read what it wrote."""
        path = home / "ui-secrets.json"
        if path.exists():
            return cls(**json.loads(path.read_text()))
        keys = cls.fresh()
        path.write_text(json.dumps({"fernet": keys.fernet, "jwt": keys.jwt, "api": keys.api}))
        path.chmod(0o600)
        return keys


@dataclass(frozen=True)
class Timing:
    """How quickly the services notice things; None leaves Airflow's default."""

    dag_refresh: int = 5  # seconds between looks for new DAG files
    min_file_process: int | None = 30  # seconds before a DAG file is parsed again
    heartbeat: int | None = 2  # scheduler and job heartbeats
    idle_sleep: float | None = 0.2  # the scheduler's pause when it found nothing to do


QUICK = Timing()  # the e2e tests: find the DAG files at once, schedule without idling
SOAK = Timing(min_file_process=600)  # the soak: DAG files parsed once, never changing mid-night
RELAXED = Timing(dag_refresh=10, min_file_process=None, heartbeat=None, idle_sleep=None)  # a UI left running


def airflow_settings(*, home: Path, port: int, metadata_db: str, keys: Keys, triggered_only: bool,
                     timing: Timing = QUICK, plugins_folder: Path | None = None,
                     log_ports: tuple[int, int] | None = None) -> dict[str, str]:
    """The ``AIRFLOW_*`` environment of a stack whose api-server listens on 127.0.0.1:``port``.

    ``plugins_folder`` defaults to an empty ``home/plugins``: the project's plugin registers
    through the package's entry point, and Airflow's plugin loader must never walk the sources.
    """
    if plugins_folder is None:
        plugins_folder = home / "plugins"
        plugins_folder.mkdir(parents=True, exist_ok=True)
    base_url = f"http://127.0.0.1:{port}"
    metadata_url = sqlalchemy_url(metadata_db)
    worker_log, trigger_log = log_ports or (free_loopback_port(), free_loopback_port())
    env = {
        "AIRFLOW_HOME": str(home),
        "PYTHONUNBUFFERED": "1",
        "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(plugins_folder),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__CORE__PARALLELISM": "4",
        "AIRFLOW__CORE__FERNET_KEY": keys.fernet,
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": metadata_url,
        "AIRFLOW__CORE__AUTH_MANAGER":
            "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
        # One secret and one Execution API URL for all processes: task runners authenticate
        # to the api-server with JWTs the scheduler signs.
        "AIRFLOW__API_AUTH__JWT_SECRET": keys.jwt,
        "AIRFLOW__API__SECRET_KEY": keys.api,
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API__BASE_URL": base_url,
        "AIRFLOW__API__WORKERS": "1",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{base_url}/execution/",
        # Loopback ports of our own, so a second Airflow on this machine cannot clash.
        "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(worker_log),
        "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(trigger_log),
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": str(timing.dag_refresh),
        "AIRFLOW__DAG_PROCESSOR__PARSING_PROCESSES": "1",
    }
    if triggered_only:
        env["AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION"] = "False"
        env["AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE"] = "False"
    if timing.min_file_process is not None:
        env["AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL"] = str(timing.min_file_process)
    if timing.heartbeat is not None:
        env.update({
            "AIRFLOW__DAG_PROCESSOR__PRINT_STATS_INTERVAL": "0",
            "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": str(timing.heartbeat),
            "AIRFLOW__SCHEDULER__JOB_HEARTBEAT_SEC": str(timing.heartbeat),
            "AIRFLOW__SCHEDULER__PARSING_CLEANUP_INTERVAL": "600",
        })
    if timing.idle_sleep is not None:
        env["AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME"] = str(timing.idle_sleep)
    return env


def code_path(*first: Path) -> str:
    """PYTHONPATH of the services: ``first`` (a module's own airflow_local_settings.py), then
    plugins/ and the repository (include/)."""
    return os.pathsep.join([*(str(p) for p in first), str(ROOT / "plugins"), str(ROOT)])


# ---------------------------------------------------------------------- the services
class AirflowServices:
    """The services of one stack as subprocesses, each leading its own process group, and the
    REST API v2 calls every user of a stack makes. ``error`` is what a refused call raises."""

    probe_timeout = 10.0  # seconds one readiness probe waits for an answer before it reads "not yet"

    def __init__(self, env: dict[str, str], workdir: Path, port: int, services: tuple[str, ...] = SERVICES, *,
                 cwd: Path | None = None, log_prefix: str = "", append_logs: bool = False,
                 error: type[Exception] = AssertionError) -> None:
        self.env, self.workdir, self.port, self.services = env, workdir, port, services
        self.cwd = cwd or workdir
        self.log_prefix, self.append_logs, self.error = log_prefix, append_logs, error
        self.base_url = f"http://127.0.0.1:{port}"
        self.home = Path(env["AIRFLOW_HOME"])
        self.processes: dict[str, subprocess.Popen] = {}
        self.logs: dict[str, Path] = {}
        self.http = requests.Session()

    # ------------------------------------------------------------------ lifecycle
    def airflow(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "airflow", *args]

    def migrate(self, timeout: float = 300) -> None:
        """``airflow db migrate`` on the metadata database (skip it for a copy of a migrated one)."""
        self.logs["db-migrate"] = self.workdir / f"{self.log_prefix}db-migrate.log"
        with self.logs["db-migrate"].open("ab" if self.append_logs else "wb") as out:
            done = subprocess.run(self.airflow("db", "migrate"), env=self.env, cwd=self.cwd, stdout=out,
                                  stderr=subprocess.STDOUT, timeout=timeout)
        if done.returncode != 0:
            raise RuntimeError(f"airflow db migrate failed\n{self.log_tail('db-migrate', 80)}")

    def start(self) -> None:
        for name in self.services:
            extra = ["--host", "127.0.0.1", "--port", str(self.port)] if name == "api-server" else []
            self.logs[name] = self.workdir / f"{self.log_prefix}{name}.log"
            with self.logs[name].open("ab" if self.append_logs else "wb") as out:  # the child keeps its own handle
                command = [*self.airflow(name), *extra]
                self.processes[name] = subprocess.Popen(
                    command, env=self.env, cwd=self.cwd, stdout=out, stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL, start_new_session=True,  # own group: stop its workers too
                )

    def wait_healthy(self, timeout: float) -> dict:
        return poll(self.healthy, timeout, f"a healthy {', '.join(self.services)}", diagnostics=self.diagnostics)

    def stop(self, wait: float = STOP_TIMEOUT) -> None:
        stop_groups(self.processes.values(), wait)
        self.http.close()

    # ------------------------------------------------------------------ health
    def check_alive(self) -> None:
        """Fail at once, with its log, when a service died (rather than at a deadline)."""
        for name, proc in self.processes.items():
            if proc.poll() is not None:
                raise RuntimeError(f"airflow {name} exited with {proc.returncode}\n{self.log_tail(name)}")

    def dead(self) -> list[str]:
        return [name for name, proc in self.processes.items() if proc.poll() is not None]

    def healthy(self) -> dict | None:
        """The health report once every started service is healthy."""
        self.check_alive()
        try:
            response = self.http.get(f"{self.base_url}/api/v2/monitor/health", timeout=self.probe_timeout)
        except (requests.ConnectionError, requests.Timeout):  # not up yet, or slow to answer while it starts
            return None
        if response.status_code != 200:
            return None
        health = response.json()
        parts = ["metadatabase"] + [s.replace("-", "_") for s in self.services if s != "api-server"]
        return health if all((health.get(part) or {}).get("status") == "healthy" for part in parts) else None

    def poll(self, probe: Callable[[], T | None], timeout: float, what: str, interval: float = 0.5) -> T:
        """``poll`` that also fails at once when a service died, with the logs at the deadline."""

        def checked() -> T | None:
            self.check_alive()
            return probe()

        return poll(checked, timeout, what, interval=interval, diagnostics=self.diagnostics)

    # ------------------------------------------------------------------ REST API
    def api(self, method: str, path: str, *, expect: tuple[int, ...] = (200,), **kwargs: Any) -> Any:
        """Call ``/api/v2{path}``; anything but an expected status fails with the body."""
        kwargs.setdefault("timeout", 30)
        response = self.http.request(method, f"{self.base_url}/api/v2{path}", **kwargs)
        if response.status_code not in expect:
            raise self.error(f"{method} /api/v2{path} answered {response.status_code}: {response.text[:2000]}")
        return response.json() if response.content else None

    def dag_parsed(self, dag_id: str) -> dict | None:
        """The DAG once serialized; an import error fails at once (the files will not change)."""
        self.check_alive()
        try:
            response = self.http.get(f"{self.base_url}/api/v2/dags/{dag_id}", timeout=self.probe_timeout)
        except requests.Timeout:  # a loaded api-server answered too slowly: not yet, poll's deadline decides
            return None
        if response.status_code == 200:
            return response.json()
        if self.api("GET", "/importErrors")["total_entries"]:
            raise RuntimeError(f"the DAG files do not import\n{self.import_errors()}")
        return None

    def import_errors(self) -> str:
        try:
            errors = self.api("GET", "/importErrors")["import_errors"]
        except Exception as exc:
            return f"(import errors unavailable: {exc})"
        listed = "\n".join(f"{e['filename']}: {e['stack_trace'][-1500:]}" for e in errors)
        return f"import errors: {listed or 'none'}\n{self.diagnostics()}"

    def wait_for_dags(self, dag_ids: Iterable[str], timeout: float) -> None:
        """Every DAG parsed, then unpaused."""
        for dag_id in dag_ids:
            dag = poll(partial(self.dag_parsed, dag_id), timeout, f"DAG {dag_id} to be parsed",
                       diagnostics=self.import_errors)
            if dag.get("is_paused"):
                self.api("PATCH", f"/dags/{dag_id}", json={"is_paused": False})

    def pools_named_by(self, dag_ids: Iterable[str]) -> list[str]:
        wanted: set[str] = set()
        for dag_id in dag_ids:
            wanted |= {t["pool"] for t in self.api("GET", f"/dags/{dag_id}/tasks")["tasks"] if t.get("pool")}
        return sorted(wanted - {"default_pool"})

    def ensure_pools(self, pools: Iterable[str], slots: int = 4, description: str = "test stack") -> None:
        """Create the pools the harvest tasks name: a deployment step, like Connections."""
        for pool in pools:
            if self.http.get(f"{self.base_url}/api/v2/pools/{pool}", timeout=30).status_code == 404:
                self.api("POST", "/pools", json={"name": pool, "slots": slots, "description": description},
                         expect=(200, 201))

    def trigger_run(self, dag_id: str, run_id: str, logical_date: Any, conf: dict[str, Any]) -> dict:
        return self.api("POST", f"/dags/{dag_id}/dagRuns",
                        json={"dag_run_id": run_id, "logical_date": logical_date.isoformat(), "conf": conf})

    def task_instances(self, dag_id: str, run_id: str) -> list[dict[str, Any]]:
        return self.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances")["task_instances"]

    def task_instance(self, dag_id: str, run_id: str, task_id: str) -> dict[str, Any]:
        return next(ti for ti in self.task_instances(dag_id, run_id) if ti["task_id"] == task_id)

    def task_states(self, dag_id: str, run_id: str) -> dict[str, str | None]:
        return {ti["task_id"]: ti["state"] for ti in self.task_instances(dag_id, run_id)}

    def task_summary(self, dag_id: str, run_id: str) -> str:
        try:
            return f"task states of {run_id}: {self.task_states(dag_id, run_id)}"
        except Exception as exc:  # diagnostics must never hide the real failure
            return f"(task states unavailable: {exc})"

    def wait_for_run(self, dag_id: str, run_id: str, timeout: float = 120.0) -> dict:
        """Poll the run until it is success or failed; the run's payload."""

        def finished() -> dict | None:
            self.check_alive()
            try:
                run = self.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}")
            except requests.Timeout:  # a loaded api-server (its one worker also serves the task runners): ask again
                return None
            return run if run["state"] in ("success", "failed") else None

        return poll(finished, timeout, f"run {dag_id}/{run_id} to finish", interval=0.5,
                    diagnostics=lambda: f"{self.task_summary(dag_id, run_id)}\n{self.diagnostics()}")

    def variable(self, key: str) -> Any:
        """A Variable's JSON value, or None when it does not exist."""
        response = self.http.get(f"{self.base_url}/api/v2/variables/{key}", timeout=30)
        if response.status_code == 404:
            return None
        response.raise_for_status()
        return json.loads(response.json()["value"])

    # ------------------------------------------------------------------ logs
    def log_tail(self, name: str, lines: int = 60) -> str:
        path = self.logs.get(name)
        if not path or not path.exists():
            return f"--- {name}: no log"
        text = path.read_text(errors="replace").splitlines()[-lines:]
        return f"--- {name} ({path}):\n" + "\n".join(text)

    def task_log_tails(self, count: int = 4, lines: int = 25) -> str:
        return task_log_tails(self.home, count, lines)

    def diagnostics(self) -> str:
        return "\n".join([*(self.log_tail(name) for name in self.logs), self.task_log_tails()])
