"""Shared fixtures: a real PostgreSQL (embedded, or HARVEST_DATABASE_URL) per test."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

ROOT = Path(__file__).resolve().parents[1]

# Under pytest-xdist (scripts/test.sh runs two workers) each worker has its own embedded
# PostgreSQL and its own AIRFLOW_HOME: the short soak restarts its server, and Airflow's
# SQLite metadata DB takes one writer at a time.
WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
PG_LABEL = f"test-{WORKER}" if WORKER else "test"

# Airflow reads these at import time; tests must never touch a user's Airflow install.
os.environ.setdefault("XDG_RUNTIME_DIR", f"/tmp/ph-runtime-{os.getuid()}")
os.makedirs(os.environ["XDG_RUNTIME_DIR"], mode=0o700, exist_ok=True)
os.environ.setdefault("AIRFLOW_HOME", str(ROOT / ".airflow-test"))
if WORKER:  # the controller set the shared home before it started this worker
    os.environ["AIRFLOW_HOME"] = os.path.join(os.environ["AIRFLOW_HOME"], WORKER)
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
os.environ.setdefault("AIRFLOW__CORE__DAGS_FOLDER", str(ROOT / "dags"))

logging.getLogger("pgserver").setLevel(logging.WARNING)  # its exit-time INFO lines hit closed streams


@pytest.fixture(scope="session")
def pg_label() -> str:
    """The embedded server's label (``include.embedded_pg``): what fault injection restarts."""
    return PG_LABEL


@pytest.fixture(scope="session")
def pg_server() -> Iterator[str]:
    """The server's URI; embedded unless HARVEST_DATABASE_URL names one (needs CREATEDB)."""
    from include import embedded_pg

    given = os.environ.get(embedded_pg.DATABASE_URL_ENV)
    if given:
        yield given
        return
    server = embedded_pg.server(PG_LABEL)
    yield server.get_uri()
    server.cleanup()  # stop it now, while pytest can still show what it logs
    embedded_pg.stop_leftover(PG_LABEL)  # a postmaster a crash test restarted is not pgserver's to stop


@pytest.fixture(scope="session")
def migrated_template(pg_server: str) -> Iterator[str]:
    """A database the schema migrations ran on once per session: what ``conn`` copies."""
    from partner_harvest.store import connect, ensure_schema

    name = f"t_template_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_server, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    params = conninfo_to_dict(pg_server)
    params["dbname"] = name
    with connect(make_conninfo("", **params)) as connection:  # closed: a template has no sessions
        ensure_schema(connection)
    yield name
    with psycopg.connect(pg_server, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture
def db(pg_server: str, request: pytest.FixtureRequest) -> Iterator[str]:
    """Conninfo of a brand-new database, dropped after the test: empty, unless the test also
    uses ``conn``; then a copy of ``migrated_template`` (CREATE DATABASE ... TEMPLATE, faster
    than running every migration again), on which ``conn``'s ensure_schema has nothing to do."""
    template = request.getfixturevalue("migrated_template") if "conn" in request.fixturenames else None
    name = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_server, autocommit=True) as admin:
        if template:
            admin.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                sql.Identifier(name), sql.Identifier(template)))
        else:
            admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    params = conninfo_to_dict(pg_server)
    params["dbname"] = name
    yield make_conninfo("", **params)
    with psycopg.connect(pg_server, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture
def conn(db: str) -> Iterator[psycopg.Connection]:
    """A connection to ``db`` with the schema in place (ensure_schema still checks it)."""
    from partner_harvest.store import connect, ensure_schema

    connection = connect(db)
    ensure_schema(connection)
    yield connection
    connection.close()


@pytest.fixture(scope="session")
def airflow_db() -> None:
    """Migrate the (SQLite) metadata DB of the tests' AIRFLOW_HOME once per session; used by
    the DAG tests and the short soak (idempotent, a few seconds)."""
    subprocess.run(
        [sys.executable, "-m", "airflow", "db", "migrate"], env=dict(os.environ), check=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )


# The longest modules first (measured, seconds in a serial run), so that under pytest-xdist
# (scripts/test.sh: two workers, whole modules per worker) neither worker is left with a
# long module at the end. The order is the same in every worker, as xdist requires.
SLOWEST_FIRST = (
    "tests/soak/test_short_soak.py",          # ~230
    "tests/e2e/test_airflow_services.py",     # ~120
    "tests/e2e/test_approval_gates_e2e.py",   # ~110
    "tests/e2e/test_health_index_states.py",  # ~40 (on the same stack)
    "tests/e2e/test_celery_executor.py",      # ~100
    "tests/e2e/test_change_feed_e2e.py",      # ~85
    "tests/e2e/test_local_ui_browser.py",     # ~85
    "tests/dags/test_mirror_dag.py",          # ~75
    "tests/unit/test_static_checks.py",       # ~60 (mypy over the whole tree): first in the gate
    "tests/e2e/test_health_page.py",          # ~75
    "tests/e2e/test_soak_scheduler.py",       # ~70
    "tests/e2e/test_connections_page.py",     # ~40
)


# Modules on one shared Airflow stack (tests/e2e/conftest.py, ``shared_airflow_stack``): one
# xdist scope, so one worker runs them one after the other (adjacent in SLOWEST_FIRST too) and
# starts the stack once. Apart, each worker would start a stack of its own: slower, still right.
SHARED_STACK_MODULES = ("tests/e2e/test_airflow_services.py", "tests/e2e/test_approval_gates_e2e.py",
                        "tests/e2e/test_rerun_from_the_ui.py", "tests/e2e/test_health_index_states.py")


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadscope`` (scripts/test.sh) with ``SHARED_STACK_MODULES`` as one scope."""
    if config.getoption("dist", None) != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SharedStackScopes(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return "shared-airflow-stack" if module in SHARED_STACK_MODULES else super()._split_scope(nodeid)

    return SharedStackScopes(config, log)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {path: i for i, path in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))  # stable: the rest keep their order
