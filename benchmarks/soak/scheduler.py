"""A real Airflow (api-server, scheduler, dag-processor, LocalExecutor) for ``--scheduler`` nights.

Nights run as DAG runs triggered through the REST API v2 and awaited by polling their
state; a task that dies is retried by the scheduler itself, after the partner's
``retry_delay`` from the registry. Airflow's metadata database lives on an embedded
PostgreSQL of its own, so that the soak's "PostgreSQL restarted" faults hit the
aggregation database only (as when the two are separate servers in production).
The services are started by the stack starter the e2e tests and the local UI share
(tests/support/airflow_stack.py); what is the soak's own is said here.
"""

from __future__ import annotations

import json
import socket
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

import requests

from benchmarks.soak.arm import ARM_ENV
from tests.support.airflow_stack import (
    SOAK,
    AirflowServices,
    Keys,
    airflow_settings,
    clean_environ,
    create_database,
    drop_database,
    free_loopback_port,
)

STARTUP_TIMEOUT = 180.0
PARSE_TIMEOUT = 180.0
RUN_TIMEOUT = 600.0  # a night, retries included


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
        self.services: AirflowServices | None = None
        self.processes: dict[str, Any] = {}
        self.logs: dict[str, Path] = {}
        self.http = requests.Session()
        self.base_url = ""
        self.env: dict[str, str] = {}
        self._meta: tuple[str, str] | None = None

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        from include import embedded_pg

        self.home.mkdir(parents=True, exist_ok=True)
        server, template = self.metadata_template or (embedded_pg.start(self.meta_label), None)
        name = f"soak_airflow_{uuid.uuid4().hex[:8]}"
        meta_db = create_database(server, name, template)
        self._meta = (server, name)
        plugins = self.workdir / "soak_plugins"  # the fault plugin instead of the project's (in the tasks' path)
        plugins.mkdir(exist_ok=True)
        (plugins / "soak_faults.py").write_text("from benchmarks.soak.arm import SoakFaultsPlugin  # noqa: F401\n")
        port = free_loopback_port()
        env = clean_environ(self.night_env, strip=("AIRFLOW__",))  # the night's Connections and registry stay
        env.update(airflow_settings(home=self.home, port=port, metadata_db=meta_db, keys=Keys.fresh(),
                                    triggered_only=True, timing=SOAK, plugins_folder=plugins))
        env[ARM_ENV] = str(self.arm_file)
        self.env = env
        self.services = AirflowServices(env, self.workdir, port, log_prefix="airflow-", error=RuntimeError)
        self.base_url, self.processes, self.logs, self.http = (
            self.services.base_url, self.services.processes, self.services.logs, self.services.http)
        if template is None:
            self.services.migrate(timeout=600)
        self.services.start()
        self.services.wait_healthy(STARTUP_TIMEOUT)
        self.services.wait_for_dags(self.dag_ids, PARSE_TIMEOUT)
        self.services.ensure_pools(self.pools, description="soak")

    def stop(self) -> None:
        """SIGTERM every service's process group (its task processes too); SIGKILL what stays."""
        if self.services is not None:
            self.services.stop()
        if self._meta:
            drop_database(*self._meta)
            self._meta = None

    @property
    def started(self) -> AirflowServices:
        """The running services (after :meth:`start`)."""
        if self.services is None:
            raise RuntimeError("the soak's Airflow stack is not started")
        return self.services

    # ------------------------------------------------------------------ REST API
    def api(self, method: str, path: str, *, expect: tuple[int, ...] = (200,), **kwargs: Any) -> Any:
        return self.started.api(method, path, expect=expect, **kwargs)

    def trigger(self, dag_id: str, run_id: str, logical_date: datetime, conf: dict[str, Any]) -> None:
        self.started.trigger_run(dag_id, run_id, logical_date, conf)

    def wait(self, dag_id: str, run_id: str, timeout: float = RUN_TIMEOUT) -> dict[str, Any]:
        """Poll the run's state until success or failed."""
        return self.started.wait_for_run(dag_id, run_id, timeout)

    def task_instances(self, dag_id: str, run_id: str) -> list[dict[str, Any]]:
        return self.started.task_instances(dag_id, run_id)

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
        return self.started.variable(key)

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
        self.started.check_alive()

    def log_tail(self, name: str, lines: int = 40) -> str:
        return self.started.log_tail(name, lines)

    def diagnostics(self) -> str:
        return self.started.diagnostics()
