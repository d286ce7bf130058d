"""Run the partner DAGs in a local Airflow with its UI, on loopback (scripts/airflow_ui.sh).

Starts (or reuses) the embedded PostgreSQL (or uses HARVEST_DATABASE_URL) with two
databases of its own, Airflow's metadata and the aggregation, the two demo partner
simulators, an alert inbox (alerts.log and a page), and Airflow's api-server, scheduler,
dag-processor and triggerer (LocalExecutor), all on 127.0.0.1. The settings are those the
end-to-end tests run with (tests/e2e/conftest.py). Ctrl-C stops everything it started but
the embedded PostgreSQL (``stop-db`` stops it); the databases, the cursors and the run
history stay for the next start. Everyone reaching the port is an admin
(SimpleAuthManager, all admins): keep it on loopback.

    airflow_ui.py [--port ...]   start it
    airflow_ui.py env            print the exports that point partner-harvest (and the airflow
                                 command) at this Airflow: eval "$(bash scripts/airflow_ui.sh env)"
    airflow_ui.py stop-db        stop the embedded PostgreSQL it left running
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "plugins"), str(ROOT)]

import psycopg  # noqa: E402
import requests  # noqa: E402
from psycopg import sql  # noqa: E402
from psycopg.conninfo import conninfo_to_dict, make_conninfo  # noqa: E402

from include import embedded_pg  # noqa: E402
from include.alert_inbox import AlertInbox  # noqa: E402
from include.simulators.process import simulator_process as simulator  # noqa: E402

# The triggerer runs deferred tasks; the partner DAGs defer nothing (their deadlines run on the
# executor), but Airflow's Home page checks it, and DAGs of your own may defer.
SERVICES = ("api-server", "scheduler", "dag-processor", "triggerer")
UI_LABEL = "ui"  # the embedded PostgreSQL's data directory label
SIERRA_KEY, SIERRA_SECRET = "demo-key", "demo-secret"


def database(server_uri: str, name: str) -> str:
    """The conninfo of database ``name`` on the server, created when missing (kept otherwise)."""
    with psycopg.connect(server_uri, autocommit=True) as admin:
        if not admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
            admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    params = conninfo_to_dict(server_uri)
    params["dbname"] = name
    return make_conninfo(**params)


def sqlalchemy_url(conninfo: str) -> str:
    """psycopg 3 URL for Airflow; a socket directory host goes in the query string."""
    from sqlalchemy.engine import URL

    p = conninfo_to_dict(conninfo)
    host = p.get("host") or None
    socket_dir = host if host and host.startswith("/") else None
    return URL.create(
        "postgresql+psycopg", username=p.get("user") or None, password=p.get("password") or None,
        host=None if socket_dir else host, port=int(p["port"]) if p.get("port") else None,
        database=p["dbname"], query={"host": socket_dir} if socket_dir else {},
    ).render_as_string(hide_password=False)


def postgres_connection(conninfo: str) -> str:
    p = conninfo_to_dict(conninfo)
    return json.dumps({"conn_type": "postgres", "host": p.get("host"), "port": int(p.get("port") or 5432),
                       "login": p.get("user"), "password": p.get("password") or None, "schema": p["dbname"]})


def stable_secrets(home: Path) -> dict[str, str]:
    """Keys the services share, kept in AIRFLOW_HOME so a restart can read what it wrote."""
    path = home / "ui-secrets.json"
    if path.exists():
        return json.loads(path.read_text())
    from cryptography.fernet import Fernet

    values = {"fernet": Fernet.generate_key().decode(), "jwt": secrets.token_urlsafe(32),
              "api": secrets.token_urlsafe(32)}
    path.write_text(json.dumps(values))
    path.chmod(0o600)
    return values


def airflow_env(home: Path, port: int, meta_db: str, aggregation_db: str, oai_url: str, sierra_url: str,
                alerts_url: str | None = None) -> dict[str, str]:
    keys = stable_secrets(home)
    base_url = f"http://127.0.0.1:{port}"
    metadata_url = sqlalchemy_url(meta_db)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW__", "AIRFLOW_CONN_", "AIRFLOW_VAR_"))}
    env.update({
        "AIRFLOW_HOME": str(home),
        "PYTHONPATH": os.pathsep.join([str(ROOT / "config"), str(ROOT / "plugins"), str(ROOT)]),
        "PYTHONUNBUFFERED": "1",
        "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(ROOT / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__CORE__PARALLELISM": "4",
        "AIRFLOW__CORE__FERNET_KEY": keys["fernet"],
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": metadata_url,
        # Airflow would derive postgresql+asyncpg (not installed); psycopg 3 does async too.
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC": metadata_url,
        "AIRFLOW__CORE__AUTH_MANAGER": "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
        "AIRFLOW__API_AUTH__JWT_SECRET": keys["jwt"],
        "AIRFLOW__API__SECRET_KEY": keys["api"],
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API__BASE_URL": base_url,
        "AIRFLOW__API__WORKERS": "1",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{base_url}/execution/",
        "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(port + 1),
        "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(port + 2),
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "10",
        "AIRFLOW__DAG_PROCESSOR__PARSING_PROCESSES": "1",
        "HARVEST_PARTNERS_FILE": os.environ.get("HARVEST_PARTNERS_FILE") or str(ROOT / "include" / "partners.yaml"),
        "AIRFLOW_CONN_AGGREGATION_DB": postgres_connection(aggregation_db),
        "AIRFLOW_CONN_PARTNER_DEMO": json.dumps({"conn_type": "http", "host": oai_url}),
        "AIRFLOW_CONN_PARTNER_DEMO_LIBRARY": json.dumps(
            {"conn_type": "http", "host": sierra_url, "login": SIERRA_KEY, "password": SIERRA_SECRET}),
    })
    if alerts_url:  # the alert inbox: alerts.log and its page
        env["AIRFLOW_CONN_HARVEST_ALERTS_WEBHOOK"] = json.dumps({"conn_type": "http", "host": f"{alerts_url}/alerts"})
    for name, value in json.loads(os.environ.get("HARVEST_UI_EXTRA_CONNECTIONS") or "{}").items():
        env[f"AIRFLOW_CONN_{name.upper()}"] = json.dumps(value)  # tests: a partner whose endpoint is down
    return env


# What the command line needs to reach this Airflow (`env`): no partner endpoints, no secrets
# the CLI does not use.
CLI_KEYS = ("AIRFLOW_HOME", "AIRFLOW__CORE__DAGS_FOLDER", "AIRFLOW__CORE__PLUGINS_FOLDER",
            "AIRFLOW__CORE__LOAD_EXAMPLES", "AIRFLOW__CORE__FERNET_KEY", "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC", "HARVEST_PARTNERS_FILE", "AIRFLOW_CONN_AGGREGATION_DB")


def print_env(home: Path, db_prefix: str) -> int:
    """The exports for `eval "$(bash scripts/airflow_ui.sh env)"` (starts the embedded PostgreSQL
    when it is not running; creates nothing else)."""
    if not (home / "ui-secrets.json").exists():
        print(f"echo 'no local Airflow in {home} yet: start it once with bash scripts/airflow_ui.sh' >&2; false")
        return 1
    pg_uri = embedded_pg.start(UI_LABEL, keep_running=True)
    env = airflow_env(home, 8080, database(pg_uri, f"{db_prefix}_meta"), database(pg_uri, f"{db_prefix}_aggregation"),
                      "", "")
    for key in CLI_KEYS:
        print(f"export {key}={shlex.quote(env[key])}")
    print(f"export PATH={shlex.quote(str(ROOT / '.venv' / 'bin'))}:\"$PATH\"")
    return 0


def drop_stray_egg_info() -> None:
    """``pip install -e .`` leaves plugins/partner_harvest.egg-info; with plugins/ on sys.path
    (Airflow puts it there) Python then sees the package twice, Airflow loads its plugin entry
    point twice, and the UI's Home page shows "Plugin 'partner_harvest' already registered"."""
    for stray in (ROOT / "plugins").glob("*.egg-info"):
        shutil.rmtree(stray)
        print(f"==> removed {stray.relative_to(ROOT)} (a second copy of the package's metadata on Airflow's sys.path)")


def stop(processes: dict[str, subprocess.Popen], wait: float = 20.0) -> None:
    """SIGTERM each service's own process group (its workers too), SIGKILL what outlives ``wait``."""
    for proc in processes.values():
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + wait
    for proc in processes.values():
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for proc in processes.values():
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def healthy(base_url: str) -> bool:
    try:
        health = requests.get(f"{base_url}/api/v2/monitor/health", timeout=5).json()
    except (requests.RequestException, ValueError):
        return False
    return all((health.get(part) or {}).get("status") == "healthy"
               for part in ("metadatabase", "scheduler", "dag_processor", "triggerer"))


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, default=int(os.environ.get("AIRFLOW_UI_PORT", 8080)),
                        help="api-server port on 127.0.0.1 (default 8080; log servers use the next two)")
    parser.add_argument("--home", type=Path, default=ROOT / ".airflow-ui", help="AIRFLOW_HOME (default .airflow-ui)")
    parser.add_argument("--db-prefix", default="airflow_ui", help="names of the two databases: <prefix>_meta, <prefix>_aggregation")
    parser.add_argument("--records", type=int, default=5000, help="size of each demo partner's collection")
    parser.add_argument("action", nargs="?", choices=["start", "env", "stop-db"], default="start",
                        help="start (default); env: print the exports for partner-harvest; stop-db: stop the "
                             "embedded PostgreSQL")
    args = parser.parse_args()
    if args.action == "env":
        return print_env(args.home, args.db_prefix)
    if args.action == "stop-db":
        embedded_pg.stop(UI_LABEL)
        print("==> the embedded PostgreSQL of the local UI is stopped")
        return 0

    args.home.mkdir(parents=True, exist_ok=True)
    drop_stray_egg_info()
    pg_uri = embedded_pg.start(UI_LABEL, keep_running=True)
    meta_db = database(pg_uri, f"{args.db_prefix}_meta")
    aggregation_db = database(pg_uri, f"{args.db_prefix}_aggregation")
    processes: dict[str, subprocess.Popen] = {}
    signal.signal(signal.SIGTERM, _interrupt)  # kill <pid> stops it as Ctrl-C does
    with ExitStack() as stack:
        n = str(args.records)
        oai_url = stack.enter_context(simulator("oai_pmh", "--records", n, "--page-size", "200",
                                                "--granularity", "seconds", "--formats", "oai_dc,lido"))
        sierra_url = stack.enter_context(simulator("sierra", "--bibs", n, "--client-key", SIERRA_KEY,
                                                   "--client-secret", SIERRA_SECRET))
        try:
            inbox = stack.enter_context(AlertInbox(args.home / "alerts.log", args.port + 3))
        except OSError:  # the port is taken: any free one (the ready lines name it)
            inbox = stack.enter_context(AlertInbox(args.home / "alerts.log"))
        env = airflow_env(args.home, args.port, meta_db, aggregation_db, oai_url, sierra_url, inbox.url)
        airflow = [sys.executable, "-m", "airflow"]
        print(f"==> Airflow metadata DB and aggregation DB on {'HARVEST_DATABASE_URL' if os.environ.get(embedded_pg.DATABASE_URL_ENV) else 'the embedded PostgreSQL'}", flush=True)
        with (args.home / "db-migrate.log").open("wb") as out:
            subprocess.run([*airflow, "db", "migrate"], env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, check=True)
        subprocess.run([sys.executable, "-m", "partner_harvest.airflow.pools"], env=env, cwd=ROOT, check=True,
                       stdout=subprocess.DEVNULL)
        stack.callback(stop, processes)
        for name in SERVICES:
            command = [*airflow, name, *(["--host", "127.0.0.1", "--port", str(args.port)] if name == "api-server" else [])]
            with (args.home / f"{name}.log").open("ab") as out:
                processes[name] = subprocess.Popen(command, env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                                   stdin=subprocess.DEVNULL, start_new_session=True)
        base_url = f"http://127.0.0.1:{args.port}"
        try:
            deadline = time.monotonic() + 180
            while not healthy(base_url):
                dead = [name for name, proc in processes.items() if proc.poll() is not None]
                if dead or time.monotonic() > deadline:
                    print(f"Airflow did not come up ({', '.join(dead) or 'timeout'}); see {args.home}/*.log", flush=True)
                    return 1
                time.sleep(1)
            print(f"==> Airflow UI ready at {base_url} (every visitor is admin: loopback only)", flush=True)
            print(f"    partners: demo (OAI-PMH) at {oai_url}, demo_library (Sierra) at {sierra_url}; their clock "
                  "stands at 2026-01-01 (the simulators' fixed clock: the health page shows it)", flush=True)
            print(f"    alerts: {inbox.url}/ and {args.home}/alerts.log", flush=True)
            print('    command line: eval "$(bash scripts/airflow_ui.sh env)"; partner-harvest status', flush=True)
            print(f"    logs: {args.home}/<service>.log; Ctrl-C stops everything but the PostgreSQL", flush=True)
            while all(proc.poll() is None for proc in processes.values()):
                time.sleep(1)
            dead = [name for name, proc in processes.items() if proc.poll() is not None]
            print(f"airflow {', '.join(dead)} exited; stopping (see {args.home}/*.log)", flush=True)
            return 1
        except KeyboardInterrupt:
            print("==> stopping", flush=True)
            if not os.environ.get(embedded_pg.DATABASE_URL_ENV):
                print(f"==> the embedded PostgreSQL keeps running (data in {embedded_pg.data_dir(UI_LABEL)}), so the "
                      "next start is quick: `bash scripts/airflow_ui.sh stop-db` stops it", flush=True)
            return 0


if __name__ == "__main__":
    raise SystemExit(main())
