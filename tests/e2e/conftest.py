"""Fixtures of the end-to-end tests: a real Airflow on loopback, started once per module.

The stack itself (services, partners, simulators, SMTP sink) is tests/support/e2e_stack.py
on the shared starter tests/support/airflow_stack.py; this file only hands it to pytest.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from tests.support.airflow_stack import drop_database
from tests.support.e2e_stack import AirflowStack, migrate_metadata_template, start_airflow, write_registry

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


@pytest.fixture(scope="module")
def airflow_env_overrides() -> dict[str, str]:
    """Extra environment for this module's services; a test module may override the fixture."""
    return {}


@pytest.fixture(scope="module")
def airflow_registry_writer() -> Callable[[Path], None]:
    """What writes the stack's partner registry before the services start; a test module may
    override it (the partners its DAGs need from the first parse, with no wait for a re-parse)."""
    return write_registry


@pytest.fixture(scope="session")
def airflow_metadata_template(pg_server: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A metadata database ``airflow db migrate`` ran on once per session; every module's
    stack starts from a copy of it (CREATE DATABASE ... TEMPLATE: a second, not a migration)."""
    name = migrate_metadata_template(pg_server, tmp_path_factory.mktemp("airflow_metadata_template"))
    yield name
    drop_database(pg_server, name)


@pytest.fixture(scope="module")
def airflow_stack(pg_server: str, tmp_path_factory: pytest.TempPathFactory, airflow_metadata_template: str,
                  airflow_env_overrides: dict[str, str],
                  airflow_registry_writer: Callable[[Path], None]) -> Iterator[AirflowStack]:
    """Airflow's three services on loopback, with the e2e partners' DAGs parsed and unpaused."""
    with ExitStack() as cleanup:  # undoes, in reverse, whatever got started
        yield start_airflow(pg_server, tmp_path_factory.mktemp("airflow_e2e"), cleanup, airflow_env_overrides,
                            metadata_template=airflow_metadata_template, registry_writer=airflow_registry_writer)


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
