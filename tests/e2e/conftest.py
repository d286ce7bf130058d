"""Fixtures of the end-to-end tests: a real Airflow on loopback, started once per module, or
once for the modules that share one (``shared_airflow_stack``).

The stack itself (services, partners, simulators, SMTP sink) is tests/support/e2e_stack.py
on the shared starter tests/support/airflow_stack.py; this file only hands it to pytest.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
from pluggy import Result

from tests.support.airflow_stack import drop_database
from tests.support.e2e_stack import AirflowStack, migrate_metadata_template, start_airflow, start_shared_airflow

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


@pytest.fixture(scope="session")
def airflow_metadata_template(pg_server: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A metadata database ``airflow db migrate`` ran on once per session; every module's
    stack starts from a copy of it (CREATE DATABASE ... TEMPLATE: a second, not a migration)."""
    name = migrate_metadata_template(pg_server, tmp_path_factory.mktemp("airflow_metadata_template"))
    yield name
    drop_database(pg_server, name)


class SharedStack:
    """The stack of the modules in ``SHARED_STACK_MODULES`` (tests/conftest.py keeps them on one
    xdist worker, one after the other): started by the first of them, stopped after the last
    test that uses it (``pytest_runtest_teardown`` below), not at the session's end, so that it
    does not run on beside the worker's other modules."""

    def __init__(self, pg_server: str, tmp_path_factory: pytest.TempPathFactory, metadata_template: str) -> None:
        self.pg_server, self.tmp_path_factory, self.metadata_template = pg_server, tmp_path_factory, metadata_template
        self.cleanup: ExitStack | None = None
        self.stack: AirflowStack | None = None

    def get(self) -> AirflowStack:
        if self.stack is None:
            self.cleanup = ExitStack()
            try:
                self.stack = start_shared_airflow(self.pg_server, self.tmp_path_factory.mktemp("airflow_shared"),
                                                  self.cleanup, metadata_template=self.metadata_template)
            except BaseException:
                self.close()
                raise
        return self.stack

    def close(self) -> None:
        cleanup, self.cleanup, self.stack = self.cleanup, None, None
        if cleanup is not None:
            cleanup.close()


SHARED = pytest.StashKey[SharedStack]()


@pytest.fixture(scope="session")
def shared_airflow_stack(pg_server: str, tmp_path_factory: pytest.TempPathFactory, airflow_metadata_template: str,
                         request: pytest.FixtureRequest) -> Iterator[SharedStack]:
    """The shared stack's holder; a module on it defines ``airflow_stack`` as its ``get()``."""
    holder = SharedStack(pg_server, tmp_path_factory, airflow_metadata_template)
    request.config.stash[SHARED] = holder
    yield holder
    holder.close()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """After the module-scoped teardowns: stop the shared stack once no test follows that uses it."""
    result = yield
    holder = item.config.stash.get(SHARED, None)
    if holder is not None and holder.stack is not None and (
            nextitem is None or "shared_airflow_stack" not in getattr(nextitem, "fixturenames", ())):
        holder.close()
    return result


@pytest.fixture(scope="module")
def airflow_stack(pg_server: str, tmp_path_factory: pytest.TempPathFactory, airflow_metadata_template: str,
                  airflow_env_overrides: dict[str, str]) -> Iterator[AirflowStack]:
    """Airflow's three services on loopback, with the e2e partners' DAGs parsed and unpaused."""
    with ExitStack() as cleanup:  # undoes, in reverse, whatever got started
        yield start_airflow(pg_server, tmp_path_factory.mktemp("airflow_e2e"), cleanup, airflow_env_overrides,
                            metadata_template=airflow_metadata_template)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item,
                              call: pytest.CallInfo[None]) -> Generator[None, Result[pytest.TestReport], None]:
    """On a failed e2e test, attach the services' and latest task logs to the report."""
    outcome = yield
    report = outcome.get_result()
    stack = getattr(item, "funcargs", {}).get("airflow_stack")
    if report.failed and isinstance(stack, AirflowStack):
        for name in stack.logs:
            report.sections.append((f"airflow {name} log", stack.log_tail(name, lines=80)))
        report.sections.append(("airflow task logs", stack.task_log_tails()))
