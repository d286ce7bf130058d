"""Run the partner DAGs in a local Airflow with its UI, on loopback (scripts/airflow_ui.sh).

Starts (or reuses) the embedded PostgreSQL (or uses HARVEST_DATABASE_URL) with two
databases of its own, Airflow's metadata and the aggregation, the three demo partner
simulators (every partner of include/partners.yaml), an alert inbox (alerts.log and a page), and Airflow's api-server, scheduler,
dag-processor and triggerer (LocalExecutor), all on 127.0.0.1, through the stack starter
the end-to-end tests and the soak share (tests/support/airflow_stack.py), with the settings
of a UI left running (schedules kept, keys kept, Airflow's own polling pace). Ctrl-C stops
everything it started but the embedded PostgreSQL (``stop-db`` stops it); the databases, the cursors and the run
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
import shlex
import shutil
import signal
import subprocess
import sys
import time
from contextlib import ExitStack
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "plugins"), str(ROOT)]

from include import embedded_pg  # noqa: E402
from include.alert_inbox import AlertInbox  # noqa: E402
from include.simulators.process import simulator_process as simulator  # noqa: E402

# The stack starter the end-to-end tests and the soak share: one set of Airflow settings.
from tests.support.airflow_stack import (  # noqa: E402
    RELAXED,
    TRIGGERER,
    AirflowServices,
    Keys,
    airflow_settings,
    clean_environ,
    code_path,
    create_database,
    http_connection,
    postgres_connection,
)
from tests.support.airflow_stack import SERVICES as CORE_SERVICES  # noqa: E402

# The triggerer runs deferred tasks; the partner DAGs defer nothing (their deadlines run on the
# executor), but Airflow's Home page checks it, and DAGs of your own may defer.
SERVICES = (*CORE_SERVICES, TRIGGERER)
UI_LABEL = "ui"  # the embedded PostgreSQL's data directory label
SIERRA_KEY, SIERRA_SECRET = "demo-key", "demo-secret"
# The IIIF stream simulator as the demo runs it (scripts/demo.py); the partner's Connection names the collection.
IIIF_ARGS, IIIF_STREAM = ("--page-sizes", "100", "--fractions"), "/stream/collection.json"


def database(server_uri: str, name: str) -> str:
    """The conninfo of database ``name`` on the server, created when missing (kept otherwise)."""
    return create_database(server_uri, name, keep=True)


def demo_files_folder(folder: Path, records: int) -> None:
    """demo_files' location: a full dump of 2026-01-01 (the simulators' day), written once."""
    if folder.exists():
        return
    import fsspec

    from include.simulators.files.publisher import Publisher

    museum = Publisher(fsspec.filesystem("file"), str(folder))
    museum.create(records)
    museum.full(datetime(2026, 1, 1, tzinfo=timezone.utc), parts=2)


def airflow_env(home: Path, port: int, meta_db: str, aggregation_db: str, oai_url: str, sierra_url: str,
                iiif_url: str = "", alerts_url: str | None = None) -> dict[str, str]:
    """The settings the tests' stacks run with, but for a UI left running: the schedules are
    kept (a new DAG starts paused), the keys survive a restart (kept in AIRFLOW_HOME), the
    log servers listen on the next two ports, the services poll at Airflow's own pace."""
    env = clean_environ(strip=("AIRFLOW__", "AIRFLOW_CONN_", "AIRFLOW_VAR_"))  # HARVEST_* are the user's
    env["PYTHONPATH"] = code_path()
    env.update(airflow_settings(home=home, port=port, metadata_db=meta_db, keys=Keys.kept_in(home),
                                triggered_only=False, timing=RELAXED, log_ports=(port + 1, port + 2)))
    env.update({
        "HARVEST_PARTNERS_FILE": os.environ.get("HARVEST_PARTNERS_FILE") or str(ROOT / "include" / "partners.yaml"),
        "AIRFLOW_CONN_AGGREGATION_DB": postgres_connection(aggregation_db),
        "AIRFLOW_CONN_PARTNER_DEMO": http_connection(oai_url),
        "AIRFLOW_CONN_PARTNER_DEMO_LIBRARY": http_connection(sierra_url, SIERRA_KEY, SIERRA_SECRET),
        # demo_files: dated CSV deliveries in a folder of AIRFLOW_HOME (demo_files_folder)
        "AIRFLOW_CONN_PARTNER_DEMO_FILES": json.dumps({"conn_type": "file_delivery", "host": f"file://{home / 'files'}"}),
        "AIRFLOW_CONN_PARTNER_DEMO_STREAM": http_connection(iiif_url),
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
            "HARVEST_PARTNERS_FILE", "AIRFLOW_CONN_AGGREGATION_DB")


def print_env(home: Path, db_prefix: str, port: int) -> int:
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
    print(f"export HARVEST_AIRFLOW_API_URL=http://127.0.0.1:{port}")  # the REST API the command line talks to
    print(f"export PATH={shlex.quote(str(ROOT / '.venv' / 'bin'))}:\"$PATH\"")
    return 0


def drop_stray_egg_info() -> None:
    """``pip install -e .`` leaves plugins/partner_harvest.egg-info; with plugins/ on sys.path
    (the editable install puts it there) Python then sees the package twice, Airflow loads its plugin entry
    point twice, and the UI's Home page shows "Plugin 'partner_harvest' already registered"."""
    for stray in (ROOT / "plugins").glob("*.egg-info"):
        shutil.rmtree(stray)
        print(f"==> removed {stray.relative_to(ROOT)} (a second copy of the package's metadata on Airflow's sys.path)")


def _healthy(services: AirflowServices) -> bool:
    """Every service healthy; False (not an exception) while one is down, the loop says which."""
    try:
        return services.healthy() is not None
    except (RuntimeError, ValueError, OSError):
        return False


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
        return print_env(args.home, args.db_prefix, args.port)
    if args.action == "stop-db":
        embedded_pg.stop(UI_LABEL)
        print("==> the embedded PostgreSQL of the local UI is stopped")
        return 0

    args.home.mkdir(parents=True, exist_ok=True)
    drop_stray_egg_info()
    pg_uri = embedded_pg.start(UI_LABEL, keep_running=True)
    meta_db = database(pg_uri, f"{args.db_prefix}_meta")
    aggregation_db = database(pg_uri, f"{args.db_prefix}_aggregation")
    signal.signal(signal.SIGTERM, _interrupt)  # kill <pid> stops it as Ctrl-C does
    with ExitStack() as stack:
        n = str(args.records)
        oai_url = stack.enter_context(simulator("oai_pmh", "--records", n, "--page-size", "200",
                                                "--granularity", "seconds", "--formats", "oai_dc,lido"))
        sierra_url = stack.enter_context(simulator("sierra", "--bibs", n, "--client-key", SIERRA_KEY,
                                                   "--client-secret", SIERRA_SECRET))
        iiif_url = stack.enter_context(simulator("iiif", *IIIF_ARGS, "--objects", n)) + IIIF_STREAM
        try:
            inbox = stack.enter_context(AlertInbox(args.home / "alerts.log", args.port + 3))
        except OSError:  # the port is taken: any free one (the ready lines name it)
            inbox = stack.enter_context(AlertInbox(args.home / "alerts.log"))
        demo_files_folder(args.home / "files", int(n))
        env = airflow_env(args.home, args.port, meta_db, aggregation_db, oai_url, sierra_url, iiif_url, inbox.url)
        services = AirflowServices(env, args.home, args.port, SERVICES, cwd=ROOT, append_logs=True)
        where = "HARVEST_DATABASE_URL" if os.environ.get(embedded_pg.DATABASE_URL_ENV) else "the embedded PostgreSQL"
        print(f"==> Airflow metadata DB and aggregation DB on {where}", flush=True)
        services.migrate(timeout=600)
        stack.callback(services.stop)
        services.start()
        base_url = f"http://127.0.0.1:{args.port}"
        try:
            deadline = time.monotonic() + 180
            while not _healthy(services):
                dead = services.dead()
                if dead or time.monotonic() > deadline:
                    print(f"Airflow did not come up ({', '.join(dead) or 'timeout'}); see {args.home}/*.log", flush=True)
                    return 1
                time.sleep(1)
            # The deployment step, through the REST API like an operator's: the partners' pools.
            subprocess.run([sys.executable, "-m", "partner_harvest.cli", "sync-pools"],
                           env={**env, "HARVEST_AIRFLOW_API_URL": base_url}, cwd=ROOT, check=True,
                           stdout=subprocess.DEVNULL)
            print(f"==> Airflow UI ready at {base_url} (every visitor is admin: loopback only)", flush=True)
            print(f"    partners: demo (OAI-PMH) at {oai_url}, demo_library (Sierra) at {sierra_url}, demo_stream "
                  f"(IIIF Change Discovery) at {iiif_url}; their clock stands at 2026-01-01 (the simulators' fixed "
                  f"clock: the health page shows it); demo_files (dated CSV deliveries) in {args.home / 'files'}",
                  flush=True)
            print(f"    alerts: {inbox.url}/ and {args.home}/alerts.log", flush=True)
            print('    command line: eval "$(bash scripts/airflow_ui.sh env)"; partner-harvest status', flush=True)
            print(f"    logs: {args.home}/<service>.log; Ctrl-C stops everything but the PostgreSQL", flush=True)
            while not services.dead():
                time.sleep(1)
            dead = services.dead()
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
