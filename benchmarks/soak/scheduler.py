"""A real Airflow (api-server, scheduler, dag-processor, LocalExecutor) for ``--scheduler`` nights.

Nights run as DAG runs triggered through the REST API v2 and awaited by polling their
state; a task that dies is retried by the scheduler itself, after the partner's
``retry_delay`` from the registry. Airflow's metadata database lives on an embedded
PostgreSQL of its own, so that the soak's "PostgreSQL restarted" faults hit the
aggregation database only (as when the two are separate servers in production).
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
import uuid
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import psycopg
import requests
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from benchmarks.soak.arm import ARM_ENV

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ("api-server", "scheduler", "dag-processor")
STARTUP_TIMEOUT = 180.0
PARSE_TIMEOUT = 180.0
RUN_TIMEOUT = 600.0  # a night, retries included
T = TypeVar("T")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def poll(probe: Callable[[], T | None], timeout: float, what: str, interval: float = 0.3,
         diagnostics: Callable[[], str] | None = None) -> T:
    """Call ``probe`` until it returns something truthy; fail naming ``what`` at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        result = probe()
        if result:
            return result
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}"
                               + (f"\n{diagnostics()}" if diagnostics else ""))
        time.sleep(interval)


def _sqlalchemy_url(conninfo: str) -> str:
    from sqlalchemy.engine import URL

    p = conninfo_to_dict(conninfo)
    host = p.get("host") or None
    socket_dir = host if host and host.startswith("/") else None
    return URL.create(
        "postgresql+psycopg", username=p.get("user") or None, password=p.get("password") or None,
        host=None if socket_dir else host, port=int(p["port"]) if p.get("port") else None,
        database=p["dbname"], query={"host": socket_dir} if socket_dir else {},
    ).render_as_string(hide_password=False)


class SchedulerStack:
    """Start with :meth:`start`, stop with :meth:`stop` (also on failure)."""

    def __init__(self, workdir: Path, night_env: dict[str, str], dag_ids: list[str], pools: list[str],
                 meta_label: str, metadata_template: tuple[str, str] | None = None) -> None:
        self.workdir, self.night_env, self.dag_ids, self.pools = workdir, night_env, dag_ids, pools
        self.meta_label = meta_label
        # (server URI, database) already migrated: the metadata database is a copy of it on
        # that server (CREATE DATABASE ... TEMPLATE) instead of a migration on a server of its own.
        self.metadata_template = metadata_template
        self.home = workdir / "airflow_home"
        self.arm_file = workdir / "armed.json"
        self.processes: dict[str, subprocess.Popen] = {}
        self.logs: dict[str, Path] = {}
        self.http = requests.Session()
        self.base_url = ""
        self._meta: tuple[str, str] | None = None

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        from include import embedded_pg

        self.home.mkdir(parents=True, exist_ok=True)
        server, template = self.metadata_template or (embedded_pg.start(self.meta_label), None)
        name = f"soak_airflow_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(server, autocommit=True) as admin:
            if template:
                admin.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                    sql.Identifier(name), sql.Identifier(template)))
            else:
                admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        self._meta = (server, name)
        params = conninfo_to_dict(server)
        params["dbname"] = name
        meta_url = _sqlalchemy_url(make_conninfo(**params))
        plugins = self.workdir / "soak_plugins"
        plugins.mkdir(exist_ok=True)
        (plugins / "soak_faults.py").write_text("from benchmarks.soak.arm import SoakFaultsPlugin  # noqa: F401\n")
        port = free_port()
        self.base_url = f"http://127.0.0.1:{port}"
        from cryptography.fernet import Fernet

        env = {k: v for k, v in self.night_env.items() if not k.startswith("AIRFLOW__")}
        env.update({
            "AIRFLOW_HOME": str(self.home),
            "PYTHONUNBUFFERED": "1",
            "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
            "AIRFLOW__CORE__PLUGINS_FOLDER": str(plugins),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__PARALLELISM": "4",
            "AIRFLOW__CORE__FERNET_KEY": Fernet.generate_key().decode(),
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
            "AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE": "False",  # only the soak's own runs
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": meta_url,
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC": meta_url,
            "AIRFLOW__CORE__AUTH_MANAGER":
                "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
            "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_urlsafe(32),
            "AIRFLOW__API__SECRET_KEY": secrets.token_urlsafe(32),
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(port),
            "AIRFLOW__API__BASE_URL": self.base_url,
            "AIRFLOW__API__WORKERS": "1",
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.base_url}/execution/",
            "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
            "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port()),
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
            "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "600",
            "AIRFLOW__DAG_PROCESSOR__PARSING_PROCESSES": "1",
            "AIRFLOW__DAG_PROCESSOR__PRINT_STATS_INTERVAL": "0",
            "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "2",
            "AIRFLOW__SCHEDULER__JOB_HEARTBEAT_SEC": "2",
            "AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME": "0.2",
            "AIRFLOW__SCHEDULER__PARSING_CLEANUP_INTERVAL": "600",
            ARM_ENV: str(self.arm_file),
        })
        self.env = env
        airflow = [sys.executable, "-m", "airflow"]
        if template is None:
            self.logs["db-migrate"] = self.workdir / "airflow-db-migrate.log"
            with self.logs["db-migrate"].open("wb") as out:
                done = subprocess.run([*airflow, "db", "migrate"], env=env, cwd=self.workdir, stdout=out,
                                      stderr=subprocess.STDOUT, timeout=600)
            if done.returncode != 0:
                raise RuntimeError(f"airflow db migrate failed\n{self.log_tail('db-migrate')}")
        commands = {"api-server": [*airflow, "api-server", "--host", "127.0.0.1", "--port", str(port)],
                    "scheduler": [*airflow, "scheduler"], "dag-processor": [*airflow, "dag-processor"]}
        for name in SERVICES:
            self.logs[name] = self.workdir / f"airflow-{name}.log"
            with self.logs[name].open("wb") as out:
                self.processes[name] = subprocess.Popen(
                    commands[name], env=env, cwd=self.workdir, stdout=out, stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL, start_new_session=True)
        poll(self._healthy, STARTUP_TIMEOUT, "a healthy api-server, scheduler and dag-processor",
             diagnostics=self.diagnostics)
        for dag_id in self.dag_ids:
            dag = poll(lambda dag_id=dag_id: self._parsed(dag_id), PARSE_TIMEOUT, f"DAG {dag_id} to be parsed",
                       diagnostics=self.diagnostics)
            if dag.get("is_paused"):
                self.api("PATCH", f"/dags/{dag_id}", json={"is_paused": False})
        for pool in self.pools:
            if self.http.get(f"{self.base_url}/api/v2/pools/{pool}", timeout=30).status_code == 404:
                self.api("POST", "/pools", json={"name": pool, "slots": 4, "description": "soak"},
                         expect=(200, 201))

    def stop(self) -> None:
        """SIGTERM every service's process group (its task processes too); SIGKILL what stays."""
        for proc in self.processes.values():
            if proc.poll() is None:
                _signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + 20
        for proc in self.processes.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for proc in self.processes.values():
            _signal_group(proc, signal.SIGKILL)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        self.http.close()
        if self._meta:
            server, name = self._meta
            with psycopg.connect(server, autocommit=True) as admin:
                admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))

    # ------------------------------------------------------------------ REST API
    def api(self, method: str, path: str, *, expect: tuple[int, ...] = (200,), **kwargs: Any) -> Any:
        kwargs.setdefault("timeout", 30)
        response = self.http.request(method, f"{self.base_url}/api/v2{path}", **kwargs)
        if response.status_code not in expect:
            raise RuntimeError(f"{method} /api/v2{path} answered {response.status_code}: {response.text[:2000]}")
        return response.json() if response.content else None

    def trigger(self, dag_id: str, run_id: str, logical_date: datetime, conf: dict[str, Any]) -> None:
        self.api("POST", f"/dags/{dag_id}/dagRuns",
                 json={"dag_run_id": run_id, "logical_date": logical_date.isoformat(), "conf": conf})

    def wait(self, dag_id: str, run_id: str, timeout: float = RUN_TIMEOUT) -> dict[str, Any]:
        """Poll the run's state until success or failed."""

        def finished() -> dict | None:
            self.check_alive()
            run = self.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}")
            return run if run["state"] in ("success", "failed") else None

        return poll(finished, timeout, f"run {dag_id}/{run_id} to finish", interval=0.5,
                    diagnostics=lambda: f"{self.task_instances(dag_id, run_id)}\n{self.diagnostics()}")

    def task_instances(self, dag_id: str, run_id: str) -> list[dict[str, Any]]:
        return self.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances")["task_instances"]

    def running_pid(self, dag_id: str, run_id: str, task_id: str) -> int | None:
        """The pid of the task process the scheduler launched for this task, while it runs.
        Called from a simulator's thread: a request of its own, not the shared session."""
        # The run's list, not the task's own endpoint: harvest_changes is a mapped task (one
        # instance per slice, map_index 0 when the run is not sliced).
        response = requests.get(f"{self.base_url}/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances",
                                params={"limit": 1000}, timeout=30)
        response.raise_for_status()
        running = [ti for ti in response.json()["task_instances"]
                   if ti.get("task_id") == task_id and ti.get("state") == "running" and ti.get("pid")]
        if not running:
            return None
        ti = running[0]
        if ti.get("hostname") and ti["hostname"] not in (socket.gethostname(), socket.getfqdn()):
            raise RuntimeError(f"{dag_id}/{run_id}/{task_id} runs on {ti['hostname']}, not here")
        return int(ti["pid"])

    def variable(self, key: str) -> Any:
        response = self.http.get(f"{self.base_url}/api/v2/variables/{key}", timeout=30)
        if response.status_code == 404:
            return None
        response.raise_for_status()
        return json.loads(response.json()["value"])

    # ------------------------------------------------------------------ faults inside task processes
    def arm(self, dag_id: str, run_id: str, moment: str, action: str, pg_label: str) -> None:
        self.disarm()
        self.arm_file.write_text(json.dumps({"dag_id": dag_id, "run_id": run_id, "moment": moment,
                                             "action": action, "pg_label": pg_label}))

    def disarm(self) -> bool:
        """Take the order back; whether a task process had fired it."""
        fired = self.arm_file.with_name(self.arm_file.name + ".fired")
        was = fired.exists()
        self.arm_file.unlink(missing_ok=True)
        fired.unlink(missing_ok=True)
        return was

    # ------------------------------------------------------------------ health
    def check_alive(self) -> None:
        for name, proc in self.processes.items():
            if proc.poll() is not None:
                raise RuntimeError(f"airflow {name} exited with {proc.returncode}\n{self.log_tail(name)}")

    def log_tail(self, name: str, lines: int = 40) -> str:
        path = self.logs.get(name)
        if not path or not path.exists():
            return f"--- {name}: no log"
        return f"--- {name} ({path}):\n" + "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def diagnostics(self) -> str:
        return "\n".join(self.log_tail(name) for name in self.logs)

    def _healthy(self) -> dict | None:
        self.check_alive()
        try:
            response = self.http.get(f"{self.base_url}/api/v2/monitor/health", timeout=5)
        except requests.ConnectionError:
            return None
        if response.status_code != 200:
            return None
        health = response.json()
        ok = all((health.get(part) or {}).get("status") == "healthy"
                 for part in ("metadatabase", "scheduler", "dag_processor"))
        return health if ok else None

    def _parsed(self, dag_id: str) -> dict | None:
        self.check_alive()
        response = self.http.get(f"{self.base_url}/api/v2/dags/{dag_id}", timeout=10)
        if response.status_code == 200:
            return response.json()
        errors = self.api("GET", "/importErrors")
        if errors["total_entries"]:
            raise RuntimeError("the DAG files do not import: "
                               + "\n".join(e["stack_trace"][-1500:] for e in errors["import_errors"]))
        return None


def _signal_group(proc: subprocess.Popen, sig: signal.Signals) -> None:
    try:
        os.killpg(proc.pid, sig)  # the group of a service this stack started
    except ProcessLookupError:
        pass
