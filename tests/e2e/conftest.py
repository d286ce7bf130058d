"""A real Airflow (api-server, scheduler, dag-processor) on loopback for end-to-end tests.

Started once per module: a fresh AIRFLOW_HOME, Airflow's metadata DB (a copy of one
migrated once per session) and the aggregation DB as separate databases on the embedded PostgreSQL, the OAI-PMH simulator and an SMTP
sink in this process, and the three Airflow services as subprocesses that reach them
over 127.0.0.1. Tests talk to Airflow through the REST API v2 only.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, TypeVar

import psycopg
import pytest
import requests
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from include.simulators.oai_pmh import OaiSimulator, SimulatedRepository

from smtp_sink import SmtpSink, free_loopback_port  # pytest (prepend mode) puts tests/e2e on sys.path

ROOT = Path(__file__).resolve().parents[2]
MUSEUM = "e2emuseum"
BROKEN = "e2ebroken"
LAGGING = "e2elagging"  # clock ten days back (the health page shows it); every tenth record invalid
ALERTS_CONN_ID = "harvest_alerts_smtp"
DOWNSTREAM_DAG = "example_downstream_jsonl"  # scheduled on the partners' Asset events
SERVICES = ("api-server", "scheduler", "dag-processor")
STARTUP_TIMEOUT = 120.0  # API healthy, scheduler and dag-processor heartbeating
PARSE_TIMEOUT = 120.0  # both harvest DAGs serialized
STOP_TIMEOUT = 20.0  # for all services, after SIGTERM, before SIGKILL
LEASE_TTL_SECONDS = 6  # a killed task's lease ends this soon after it stops renewing
T = TypeVar("T")


E2E_TIMEOUT = 900  # a module's first test also starts the whole Airflow stack


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "e2e: runs a real Airflow api-server, scheduler and dag-processor on loopback"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every e2e test gets the e2e time limit (a marker set on the test itself still wins)."""
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(E2E_TIMEOUT))


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


@dataclass
class AirflowStack:
    """Handles on everything the fixture started, and helpers the tests share."""

    base_url: str
    home: Path
    env: dict[str, str]
    repo: SimulatedRepository
    simulator: OaiSimulator
    sink: SmtpSink
    aggregation_db: str
    registry: Path
    museum: str = MUSEUM  # the healthy partner
    broken: str = BROKEN  # the partner whose endpoint is a closed port
    lagging: str = LAGGING
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)
    logs: dict[str, Path] = field(default_factory=dict)
    http: requests.Session = field(default_factory=requests.Session)

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
            raise AssertionError(
                f"{method} /api/v2{path} answered {response.status_code}: {response.text[:2000]}"
            )
        return response.json() if response.content else None

    def trigger(self, dag_id: str, conf: dict[str, Any], logical_date: datetime | None = None) -> dict:
        body = {
            "dag_run_id": f"e2e__{uuid.uuid4().hex[:10]}",
            "logical_date": (logical_date or datetime.now(timezone.utc)).isoformat(),
            "conf": conf,
        }
        return self.api("POST", f"/dags/{dag_id}/dagRuns", json=body)

    def wait_for_run(self, dag_id: str, run_id: str, timeout: float = 120.0) -> dict:
        """Poll the run until it is success or failed; the run's payload."""

        def finished() -> dict | None:
            self.check_alive()
            run = self.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}")
            return run if run["state"] in ("success", "failed") else None

        return poll(finished, timeout, f"run {dag_id}/{run_id} to finish", interval=0.5,
                    diagnostics=lambda: self.task_summary(dag_id, run_id))

    def task_states(self, dag_id: str, run_id: str) -> dict[str, str | None]:
        tis = self.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances")["task_instances"]
        return {ti["task_id"]: ti["state"] for ti in tis}

    def task_summary(self, dag_id: str, run_id: str) -> str:
        try:
            return f"task states of {run_id}: {self.task_states(dag_id, run_id)}"
        except Exception as exc:  # diagnostics must never hide the real failure
            return f"(task states unavailable: {exc})"

    def variable(self, key: str) -> Any:
        """A Variable's JSON value, or None when it does not exist."""
        response = self.http.get(f"{self.base_url}/api/v2/variables/{key}", timeout=30)
        if response.status_code == 404:
            return None
        response.raise_for_status()
        return json.loads(response.json()["value"])

    # ------------------------------------------------------------------ processes
    def check_alive(self) -> None:
        """Fail at once, with its log, when a service died (rather than at a deadline)."""
        for name, proc in self.processes.items():
            if proc.poll() is not None:
                raise RuntimeError(f"airflow {name} exited with {proc.returncode}\n{self.log_tail(name)}")

    def log_tail(self, name: str, lines: int = 60) -> str:
        path = self.logs.get(name)
        if not path or not path.exists():
            return f"--- {name}: no log"
        text = path.read_text(errors="replace").splitlines()[-lines:]
        return f"--- {name} ({path}):\n" + "\n".join(text)

    def task_log_tails(self, count: int = 4, lines: int = 25) -> str:
        """The most recently written task logs (level and event only): where a task says why."""
        logs = sorted((self.home / "logs").rglob("attempt=*.log"), key=lambda p: p.stat().st_mtime)
        parts = []
        for path in logs[-count:]:
            text = [_log_event(line) for line in path.read_text(errors="replace").splitlines()[-lines:]]
            parts.append(f"--- {path.relative_to(self.home)}:\n" + "\n".join(text))
        return "\n".join(parts)

    def diagnostics(self) -> str:
        return "\n".join([*(self.log_tail(name) for name in self.logs), self.task_log_tails()])


# ---------------------------------------------------------------------- helpers
def _log_event(line: str) -> str:
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


def _create_database(server_uri: str, name: str, template: str | None = None) -> str:
    """A new, empty database (or a copy of ``template``, which nobody may be connected to)."""
    with psycopg.connect(server_uri, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        if template:
            admin.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                sql.Identifier(name), sql.Identifier(template)))
        else:
            admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    params = conninfo_to_dict(server_uri)
    params["dbname"] = name
    return make_conninfo(**params)


def _drop_database(server_uri: str, name: str) -> None:
    with psycopg.connect(server_uri, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def _sqlalchemy_url(conninfo: str) -> str:
    """psycopg 3 URL; a socket directory host goes in the query string (``?host=/dir``)."""
    from sqlalchemy.engine import URL

    p = conninfo_to_dict(conninfo)
    host = p.get("host") or None
    socket_dir = host if host and host.startswith("/") else None
    url = URL.create(
        "postgresql+psycopg",
        username=p.get("user") or None,
        password=p.get("password") or None,
        host=None if socket_dir else host,
        port=int(p["port"]) if p.get("port") else None,
        database=p["dbname"],
        query={"host": socket_dir} if socket_dir else {},
    )
    return url.render_as_string(hide_password=False)


def _postgres_connection(conninfo: str) -> str:
    p = conninfo_to_dict(conninfo)
    return json.dumps({
        "conn_type": "postgres", "host": p.get("host"), "port": int(p.get("port") or 5432),
        "login": p.get("user"), "password": p.get("password") or None, "schema": p["dbname"],
    })


def _write_registry(path: Path) -> None:
    """A healthy partner, one whose endpoint is a closed port (fails at once, no retries) and one
    whose clock stands ten days back."""
    path.write_text(
        "partners:\n"
        f"  - id: {MUSEUM}\n"
        "    protocol: oai-pmh\n"
        f"    conn_id: partner_{MUSEUM}\n"
        "    metadata_prefix: auto\n"
        "    lag: 5m\n"
        "    options: {http: {backoff_factor: 0.01, retries: 1}}\n"
        f"  - id: {BROKEN}\n"
        "    protocol: oai-pmh\n"
        f"    conn_id: partner_{BROKEN}\n"
        "    metadata_prefix: auto\n"
        "    retries: 0\n"
        "    options: {http: {backoff_factor: 0.01, retries: 1}}\n"
        f"  - id: {LAGGING}\n"
        "    protocol: oai-pmh\n"
        f"    conn_id: partner_{LAGGING}\n"
        "    metadata_prefix: auto\n"
        "    options: {http: {backoff_factor: 0.01, retries: 1}}\n",
        encoding="utf-8",
    )


def _base_env(home: Path) -> dict[str, str]:
    """This process's environment without any Airflow setting a developer or test left in it."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AIRFLOW__", "AIRFLOW_CONN_", "AIRFLOW_VAR_", "HARVEST_"))}
    env["AIRFLOW_HOME"] = str(home)
    env.setdefault("XDG_RUNTIME_DIR", f"/tmp/ph-runtime-{os.getuid()}")
    # config/: the airflow_local_settings.py a deployment installs (the psycopg 3 lock check).
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "config"), str(ROOT / "plugins"), str(ROOT)])
    env["PYTHONUNBUFFERED"] = "1"
    return env


def signal_group(proc: subprocess.Popen, sig: signal.Signals) -> None:
    """Signal the process group of a process these fixtures started (it leads its group)."""
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def stop_groups(processes: list[subprocess.Popen]) -> None:
    """SIGTERM every service's process group at once (its workers too); SIGKILL what outlives the wait."""
    for proc in processes:
        if proc.poll() is None:
            signal_group(proc, signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT
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


def _ensure_pools(stack: AirflowStack, dag_ids: tuple[str, ...]) -> None:
    """Create any pool the harvest tasks name: a deployment step, like Connections."""
    wanted: set[str] = set()
    for dag_id in dag_ids:
        for task in stack.api("GET", f"/dags/{dag_id}/tasks")["tasks"]:
            if task.get("pool"):
                wanted.add(task["pool"])
    for pool in sorted(wanted - {"default_pool"}):
        found = stack.http.get(f"{stack.base_url}/api/v2/pools/{pool}", timeout=30)
        if found.status_code == 404:
            stack.api("POST", "/pools", json={"name": pool, "slots": 4, "description": "e2e"},
                      expect=(200, 201))


def _services_healthy(stack: AirflowStack) -> dict | None:
    stack.check_alive()
    try:
        response = stack.http.get(f"{stack.base_url}/api/v2/monitor/health", timeout=5)
    except requests.ConnectionError:
        return None
    if response.status_code != 200:
        return None
    health = response.json()
    ok = all((health.get(part) or {}).get("status") == "healthy"
             for part in ("metadatabase", "scheduler", "dag_processor"))
    return health if ok else None


def _dag_parsed(stack: AirflowStack, dag_id: str) -> dict | None:
    """The DAG once serialized; an import error fails at once (the files will not change)."""
    stack.check_alive()
    response = stack.http.get(f"{stack.base_url}/api/v2/dags/{dag_id}", timeout=10)
    if response.status_code == 200:
        return response.json()
    if stack.api("GET", "/importErrors")["total_entries"]:
        raise RuntimeError(f"the DAG files do not import\n{_import_errors(stack)}")
    return None


def _import_errors(stack: AirflowStack) -> str:
    try:
        errors = stack.api("GET", "/importErrors")["import_errors"]
    except Exception as exc:
        return f"(import errors unavailable: {exc})"
    listed = "\n".join(f"{e['filename']}: {e['stack_trace'][-1500:]}" for e in errors)
    return f"import errors: {listed or 'none'}\n{stack.diagnostics()}"


# ---------------------------------------------------------------------- the fixture
@pytest.fixture(scope="module")
def airflow_env_overrides() -> dict[str, str]:
    """Extra environment for this module's services; a test module may override the fixture."""
    return {}


@pytest.fixture(scope="session")
def airflow_metadata_template(pg_server: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A metadata database ``airflow db migrate`` ran on once per session; every module's
    stack starts from a copy of it (CREATE DATABASE ... TEMPLATE: a second, not a migration)."""
    base = tmp_path_factory.mktemp("airflow_metadata_template")
    name = f"e2e_airflow_template_{uuid.uuid4().hex[:8]}"
    url = _sqlalchemy_url(_create_database(pg_server, name))
    env = _base_env(base / "airflow_home")
    env.update({"AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": url, "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC": url,
                "AIRFLOW__CORE__LOAD_EXAMPLES": "False"})
    log = base / "db-migrate.log"
    try:
        with log.open("wb") as out:
            done = subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], env=env, cwd=base,
                                  stdout=out, stderr=subprocess.STDOUT, timeout=300)
        if done.returncode != 0:
            raise RuntimeError(f"airflow db migrate failed\n{log.read_text(errors='replace')[-4000:]}")
        yield name
    finally:
        _drop_database(pg_server, name)


@pytest.fixture(scope="module")
def airflow_stack(pg_server: str, tmp_path_factory: pytest.TempPathFactory, airflow_metadata_template: str,
                  airflow_env_overrides: dict[str, str]) -> Iterator[AirflowStack]:
    """Airflow's three services on loopback, with both e2e partners' DAGs parsed and unpaused."""
    with ExitStack() as cleanup:  # undoes, in reverse, whatever got started
        yield _start_airflow(pg_server, tmp_path_factory.mktemp("airflow_e2e"), cleanup, airflow_env_overrides,
                             metadata_template=airflow_metadata_template)


def _start_airflow(pg_server: str, base: Path, cleanup: ExitStack,
                   overrides: dict[str, str] | None = None, metadata_template: str | None = None) -> AirflowStack:
    """Start everything, registering each piece's undo on ``cleanup`` as soon as it exists.

    With ``metadata_template`` (an already migrated metadata database) the stack's metadata
    database is a copy of it; otherwise ``airflow db migrate`` runs on a new one."""
    home = base / "airflow_home"
    home.mkdir()
    suffix = uuid.uuid4().hex[:8]
    meta_db = _create_database(pg_server, f"e2e_airflow_{suffix}", template=metadata_template)
    cleanup.callback(_drop_database, pg_server, f"e2e_airflow_{suffix}")
    aggregation_db = _create_database(pg_server, f"e2e_agg_{suffix}")
    cleanup.callback(_drop_database, pg_server, f"e2e_agg_{suffix}")
    registry = base / "partners.yaml"
    _write_registry(registry)

    # The simulator's clock sits just before now, so the backfill's past days hold records.
    now = datetime.now(timezone.utc).replace(microsecond=0)
    repo = SimulatedRepository(records=300, page_size=100, seed=5, start_clock=now)
    simulator = cleanup.enter_context(OaiSimulator(repo))
    lagging = cleanup.enter_context(OaiSimulator(
        SimulatedRepository(records=40, page_size=100, seed=6, start_clock=now - timedelta(days=10), invalid_every=10)))
    sink = cleanup.enter_context(SmtpSink())
    port = free_loopback_port()
    base_url = f"http://127.0.0.1:{port}"
    metadata_url = _sqlalchemy_url(meta_db)

    env = _base_env(home)
    env.update({
        "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(ROOT / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__CORE__PARALLELISM": "4",
        "AIRFLOW__CORE__FERNET_KEY": _fernet_key(),
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
        # Every run here is triggered by a test: no cron runs racing them for the cursor.
        "AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": metadata_url,
        # Airflow derives the async URL as postgresql+asyncpg (not installed); psycopg 3 does async.
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC": metadata_url,
        "AIRFLOW__CORE__AUTH_MANAGER":
            "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
        # One secret and one Execution API URL for all processes: task runners authenticate
        # to the api-server with JWTs the scheduler signs.
        "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_urlsafe(32),
        "AIRFLOW__API__SECRET_KEY": secrets.token_urlsafe(32),
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API__BASE_URL": base_url,
        "AIRFLOW__API__WORKERS": "1",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{base_url}/execution/",
        # Loopback ports of our own, so a second Airflow on this machine cannot clash.
        "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_loopback_port()),
        "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_loopback_port()),
        # Short intervals: find the DAG file at once, schedule without idling.
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
        "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "30",
        "AIRFLOW__DAG_PROCESSOR__PARSING_PROCESSES": "1",
        "AIRFLOW__DAG_PROCESSOR__PRINT_STATS_INTERVAL": "0",
        "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "2",
        "AIRFLOW__SCHEDULER__JOB_HEARTBEAT_SEC": "2",
        "AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME": "0.2",
        "AIRFLOW__SCHEDULER__PARSING_CLEANUP_INTERVAL": "600",
        "HARVEST_PARTNERS_FILE": str(registry),
        "HARVEST_LEASE_TTL_SECONDS": str(LEASE_TTL_SECONDS),
        "AIRFLOW_CONN_AGGREGATION_DB": _postgres_connection(aggregation_db),
        f"AIRFLOW_CONN_PARTNER_{MUSEUM.upper()}": json.dumps({"conn_type": "http", "host": simulator.base_url}),
        f"AIRFLOW_CONN_PARTNER_{BROKEN.upper()}": json.dumps(
            {"conn_type": "http", "host": f"http://127.0.0.1:{free_loopback_port()}/oai"}),
        f"AIRFLOW_CONN_PARTNER_{LAGGING.upper()}": json.dumps({"conn_type": "http", "host": lagging.base_url}),
        f"AIRFLOW_CONN_{ALERTS_CONN_ID.upper()}": json.dumps({
            "conn_type": "smtp", "host": "127.0.0.1", "port": sink.port,
            "extra": {"to": "ops@example.org", "from_email": "airflow@harvest.example",
                      "disable_tls": True, "disable_ssl": True},
        }),
    })
    env.update(overrides or {})

    stack = AirflowStack(base_url=base_url, home=home, env=env, repo=repo, simulator=simulator,
                         sink=sink, aggregation_db=aggregation_db, registry=registry)
    cleanup.callback(stack.http.close)
    cleanup.callback(lambda: stop_groups(list(stack.processes.values())))  # runs before the rest
    airflow = [sys.executable, "-m", "airflow"]
    if metadata_template is None:
        stack.logs["db-migrate"] = base / "db-migrate.log"
        with stack.logs["db-migrate"].open("wb") as out:
            done = subprocess.run([*airflow, "db", "migrate"], env=env, cwd=base, stdout=out,
                                  stderr=subprocess.STDOUT, timeout=300)
        if done.returncode != 0:
            raise RuntimeError(f"airflow db migrate failed\n{stack.log_tail('db-migrate')}")
    commands = {
        "api-server": [*airflow, "api-server", "--host", "127.0.0.1", "--port", str(port)],
        "scheduler": [*airflow, "scheduler"],
        "dag-processor": [*airflow, "dag-processor"],
    }
    for name in SERVICES:
        stack.logs[name] = base / f"{name}.log"
        with stack.logs[name].open("wb") as out:  # the child keeps its own handle
            stack.processes[name] = subprocess.Popen(
                commands[name], env=env, cwd=base, stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,  # own group: stop its workers too
            )
    poll(lambda: _services_healthy(stack), STARTUP_TIMEOUT,
         "a healthy api-server, scheduler and dag-processor", diagnostics=stack.diagnostics)
    _log_in(stack)
    dag_ids = (f"harvest_{MUSEUM}", f"harvest_{BROKEN}", f"reconcile_{MUSEUM}", f"harvest_{LAGGING}", DOWNSTREAM_DAG)
    for dag_id in dag_ids:
        dag = poll(lambda dag_id=dag_id: _dag_parsed(stack, dag_id), PARSE_TIMEOUT, f"DAG {dag_id} to be parsed",
                   diagnostics=lambda: _import_errors(stack))
        if dag.get("is_paused"):
            stack.api("PATCH", f"/dags/{dag_id}", json={"is_paused": False})
    _ensure_pools(stack, dag_ids)
    return stack


def login_credentials(env: dict[str, str]) -> tuple[str, str] | None:
    """The (user, password) a module's stack runs with, when it turned off all-admins mode."""
    if env.get("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS", "True").lower() != "false":
        return None
    user = env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS"].split(",")[0].split(":")[0]
    passwords = json.loads(Path(env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"]).read_text())
    return user, passwords[user]


def _log_in(stack: AirflowStack) -> None:
    """With real users, the tests' REST calls carry a token from ``/auth/token`` like any client."""
    credentials = login_credentials(stack.env)
    if credentials is None:
        return
    user, password = credentials
    response = stack.http.post(f"{stack.base_url}/auth/token", json={"username": user, "password": password},
                               timeout=30)
    response.raise_for_status()
    stack.http.headers["Authorization"] = f"Bearer {response.json()['access_token']}"


def _fernet_key() -> str:
    from cryptography.fernet import Fernet

    return Fernet.generate_key().decode()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    """On a failed e2e test, attach the services' and latest task logs to the report."""
    outcome = yield
    report = outcome.get_result()
    stack = getattr(item, "funcargs", {}).get("airflow_stack")
    if report.failed and isinstance(stack, AirflowStack):
        for name in stack.logs:
            report.sections.append((f"airflow {name} log", stack.log_tail(name, lines=80)))
        report.sections.append(("airflow task logs", stack.task_log_tails()))
