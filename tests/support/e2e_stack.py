"""The end-to-end tests' Airflow: the shared starter (tests/support/airflow_stack.py) with
the e2e partners pointed at simulators and an SMTP sink in this process.

A fresh AIRFLOW_HOME, Airflow's metadata DB (a copy of one migrated once per session) and
the aggregation DB as separate databases on the embedded PostgreSQL, the OAI-PMH
simulators, the SMTP sink, and the services as subprocesses that reach them over
127.0.0.1. Tests talk to Airflow through the REST API v2 only.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable, Iterable
from contextlib import ExitStack
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from include.simulators.oai_pmh import OaiSimulator, SimulatedRepository
from tests.support.airflow_stack import (
    DISCARD_WAIT,
    QUICK,
    AirflowServices,
    Keys,
    airflow_settings,
    clean_environ,
    code_path,
    create_database,
    drop_database,
    free_loopback_port,
    http_connection,
    poll,
    postgres_connection,
    sqlalchemy_url,
)
from tests.support.smtp_sink import SmtpSink

MUSEUM = "e2emuseum"
BROKEN = "e2ebroken"
LAGGING = "e2elagging"  # clock ten days back (the health page shows it); every tenth record invalid
ALERTS_CONN_ID = "harvest_alerts_smtp"
DOWNSTREAM_DAG = "example_downstream_jsonl"  # scheduled on the partners' Asset events
STARTUP_TIMEOUT = 120.0  # API healthy, scheduler and dag-processor heartbeating
PARSE_TIMEOUT = 120.0  # every e2e DAG serialized
LEASE_TTL_SECONDS = 6  # a killed task's lease ends this soon after it stops renewing
DAG_IDS = (f"harvest_{MUSEUM}", f"harvest_{BROKEN}", f"reconcile_{MUSEUM}", f"harvest_{LAGGING}", DOWNSTREAM_DAG)
# The shared stack's partner whose pool is never created (run_deadline 1m, the museum's endpoint):
# tests/e2e/test_airflow_services.py triggers it; its DAG is not among those the stack waits
# for, so the stack creates no pool for it.
POOLLESS = "e2epoolless"
# The shared stack's partner whose server the rerun tests break and mend (tests/e2e/
# test_rerun_from_the_ui.py, test_airflow_services.py): no retries, a 20 s task timeout.
FLAKY = "e2eflaky"
# The shared stack's partner whose endpoint is a closed port and which Airflow retries, ten
# minutes later: tests/e2e/test_health_index_states.py finds it `retrying` on the health index.
RETRIER = "e2eretrier"


class AirflowStack(AirflowServices):
    """The services, plus handles on what the e2e tests look at: the simulators, the sink,
    the aggregation database, the registry file."""

    repo: SimulatedRepository
    simulator: OaiSimulator
    sink: SmtpSink
    aggregation_db: str
    metadata_db: str  # conninfo of Airflow's metadata database (a test may move a deadline in it)
    registry: Path
    approval: Any = None  # the approval partners (tests/support/approval_partners.py) on the shared stack
    flaky: OaiSimulator | None = None  # the FLAKY partner's server on the shared stack
    museum = MUSEUM  # the healthy partner
    broken = BROKEN  # the partner whose endpoint is a closed port
    lagging = LAGGING

    def trigger(self, dag_id: str, conf: dict[str, Any], logical_date: datetime | None = None) -> dict:
        return self.trigger_run(dag_id, f"e2e__{uuid.uuid4().hex[:10]}", logical_date or datetime.now(timezone.utc),
                                conf)


def write_registry(path: Path) -> None:
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


def base_env(home: Path) -> dict[str, str]:
    """This process's environment without any Airflow setting a developer or test left in it."""
    env = clean_environ()
    env["AIRFLOW_HOME"] = str(home)
    env.setdefault("XDG_RUNTIME_DIR", f"/tmp/ph-runtime-{os.getuid()}")
    env["PYTHONPATH"] = code_path()
    env["PYTHONUNBUFFERED"] = "1"
    return env


def migrate_metadata_template(server_uri: str, base: Path) -> str:
    """A metadata database ``airflow db migrate`` ran on: what every module's stack copies."""
    name = f"e2e_airflow_template_{uuid.uuid4().hex[:8]}"
    url = sqlalchemy_url(create_database(server_uri, name))
    env = base_env(base / "airflow_home")
    env.update({"AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": url, "AIRFLOW__CORE__LOAD_EXAMPLES": "False"})
    try:
        AirflowServices(env, base, 0).migrate()
    except Exception:
        drop_database(server_uri, name)
        raise
    return name


def start_airflow(pg_server: str, base: Path, cleanup: ExitStack,
                  overrides: dict[str, str] | None = None, metadata_template: str | None = None, *,
                  registry_writer: Callable[[Path], None] = write_registry,
                  dag_ids: Iterable[str] = DAG_IDS, startup_timeout: float = STARTUP_TIMEOUT) -> AirflowStack:
    """Start everything, registering each piece's undo on ``cleanup`` as soon as it exists.

    With ``metadata_template`` (an already migrated metadata database) the stack's metadata
    database is a copy of it; otherwise ``airflow db migrate`` runs on a new one. A module
    with partners of its own passes ``registry_writer`` (their Connections in ``overrides``)
    and the ``dag_ids`` to wait for; ``startup_timeout`` bounds the wait for healthy services."""
    home = base / "airflow_home"
    home.mkdir()
    suffix = uuid.uuid4().hex[:8]
    meta_db = create_database(pg_server, f"e2e_airflow_{suffix}", template=metadata_template)
    cleanup.callback(drop_database, pg_server, f"e2e_airflow_{suffix}")
    aggregation_db = create_database(pg_server, f"e2e_agg_{suffix}")
    cleanup.callback(drop_database, pg_server, f"e2e_agg_{suffix}")
    registry = base / "partners.yaml"
    registry_writer(registry)

    # The simulator's clock sits just before now, so the backfill's past days hold records.
    now = datetime.now(timezone.utc).replace(microsecond=0)
    repo = SimulatedRepository(records=300, page_size=100, seed=5, start_clock=now)
    simulator = cleanup.enter_context(OaiSimulator(repo))
    lagging = cleanup.enter_context(OaiSimulator(
        SimulatedRepository(records=40, page_size=100, seed=6, start_clock=now - timedelta(days=10), invalid_every=10)))
    sink = cleanup.enter_context(SmtpSink())
    port = free_loopback_port()

    env = base_env(home)
    env.update(airflow_settings(home=home, port=port, metadata_db=meta_db, keys=Keys.fresh(), triggered_only=True,
                                timing=QUICK))
    env.update({
        "HARVEST_PARTNERS_FILE": str(registry),
        "HARVEST_LEASE_TTL_SECONDS": str(LEASE_TTL_SECONDS),
        "HARVEST_ALERT_DIGEST_MINUTES": "0",  # every failure mails at once: a test waits for its own run's alert
        "AIRFLOW_CONN_AGGREGATION_DB": postgres_connection(aggregation_db),
        f"AIRFLOW_CONN_PARTNER_{MUSEUM.upper()}": http_connection(simulator.base_url),
        f"AIRFLOW_CONN_PARTNER_{BROKEN.upper()}": http_connection(f"http://127.0.0.1:{free_loopback_port()}/oai"),
        f"AIRFLOW_CONN_PARTNER_{LAGGING.upper()}": http_connection(lagging.base_url),
        f"AIRFLOW_CONN_{ALERTS_CONN_ID.upper()}": json.dumps({
            "conn_type": "smtp", "host": "127.0.0.1", "port": sink.port,
            "extra": {"to": "ops@example.org", "from_email": "airflow@harvest.example",
                      "disable_tls": True, "disable_ssl": True},
        }),
    })
    env.update(overrides or {})

    stack = AirflowStack(env, base, port)
    stack.repo, stack.simulator, stack.sink = repo, simulator, sink
    stack.aggregation_db, stack.registry, stack.metadata_db = aggregation_db, registry, meta_db
    cleanup.callback(stack.stop, DISCARD_WAIT)  # runs before the rest
    if metadata_template is None:
        stack.migrate()
    stack.start()
    stack.wait_healthy(startup_timeout)
    log_in(stack)
    dag_ids = tuple(dag_ids)
    stack.wait_for_dags(dag_ids, PARSE_TIMEOUT)
    stack.ensure_pools(stack.pools_named_by(dag_ids), description="e2e")
    return stack


def start_shared_airflow(pg_server: str, base: Path, cleanup: ExitStack,
                         metadata_template: str | None = None) -> AirflowStack:
    """The stack tests/e2e/test_airflow_services.py and tests/e2e/test_approval_gates_e2e.py
    share (one start for both): the e2e partners, ``POOLLESS`` and the approval partners
    (tests/support/approval_partners.py, on ``stack.approval``) in one registry. The two
    modules' partners are disjoint, and neither counts anything across partners."""
    from tests.support.approval_partners import DAG_IDS as APPROVAL_DAG_IDS
    from tests.support.approval_partners import ApprovalPartners, registry_lines

    approval = cleanup.enter_context(ApprovalPartners())
    flaky = cleanup.enter_context(OaiSimulator(SimulatedRepository(records=60, page_size=50, seed=8)))

    def registry(path: Path) -> None:
        write_registry(path)
        with path.open("a", encoding="utf-8") as out:
            out.write(f"  - {{id: {POOLLESS}, protocol: oai-pmh, conn_id: partner_{MUSEUM}, run_deadline: 1m}}\n")
            out.write(f"  - {{id: {FLAKY}, protocol: oai-pmh, conn_id: partner_{FLAKY}, metadata_prefix: oai_dc,"
                      " retries: 0, execution_timeout: 20s,"
                      " options: {http: {backoff_factor: 0.01, retries: 1, read_timeout: 60}}}\n")
            out.write(f"  - {{id: {RETRIER}, protocol: oai-pmh, conn_id: partner_{RETRIER}, metadata_prefix: oai_dc,"
                      " retries: 2, retry_delay: 10m, options: {http: {retries: 0}}}\n")
            out.write(registry_lines())

    overrides = {**approval.overrides(), f"AIRFLOW_CONN_PARTNER_{FLAKY.upper()}": http_connection(flaky.base_url),
                 f"AIRFLOW_CONN_PARTNER_{RETRIER.upper()}": http_connection(f"http://127.0.0.1:{free_loopback_port()}/oai")}
    stack = start_airflow(pg_server, base, cleanup, overrides, metadata_template, registry_writer=registry,
                          dag_ids=(*DAG_IDS, f"harvest_{FLAKY}", *APPROVAL_DAG_IDS, f"harvest_{RETRIER}"),
                          startup_timeout=300)
    stack.approval, stack.flaky = approval, flaky
    return stack


def login_credentials(env: dict[str, str]) -> tuple[str, str] | None:
    """The (user, password) a module's stack runs with, when it turned off all-admins mode."""
    if env.get("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS", "True").lower() != "false":
        return None
    user = env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS"].split(",")[0].split(":")[0]
    passwords = json.loads(Path(env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"]).read_text())
    return user, passwords[user]


def log_in(stack: AirflowServices) -> None:
    """With real users, the tests' REST calls carry a token from ``/auth/token`` like any client."""
    credentials = login_credentials(stack.env)
    if credentials is None:
        return
    user, password = credentials
    response = stack.http.post(f"{stack.base_url}/auth/token", json={"username": user, "password": password},
                               timeout=30)
    response.raise_for_status()
    stack.http.headers["Authorization"] = f"Bearer {response.json()['access_token']}"


__all__ = ["AirflowStack", "poll", "start_airflow", "start_shared_airflow", "write_registry", "MUSEUM", "BROKEN",
           "LAGGING", "POOLLESS", "FLAKY", "RETRIER",
           "LEASE_TTL_SECONDS", "ALERTS_CONN_ID", "DOWNSTREAM_DAG", "migrate_metadata_template"]
