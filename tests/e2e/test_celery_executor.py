"""Harvests on the CeleryExecutor: a real Redis broker and two Celery workers on loopback.

What the LocalExecutor stack cannot show: tasks of one deployment running on different
machines, sharing nothing but the databases and the broker, and a task whose machine
died (SIGKILL of its worker and every process under it) retried by Airflow on the other
one, with the aggregation still exactly the partner's live set.

Two partners' full harvests run at once, each gated at the same page of its ListRecords
chain; with one slot per worker, the two chains must be running on the two workers.

After the sliced harvest (mapped ``harvest_slice``) lands, the same test on one partner:
PARTNERS = (MUSEUM,) with a registry slice setting that splits RECORDS into >= 2 slices;
wait for the gate and for two running ``harvest_slice`` instances (``running_on`` with
their map_index; list them with ``GET .../taskInstances?task_id=harvest_slice``); kill
the worker of one; ``tries(..., map_index=...)`` of that slice; and the pages check
becomes ``list_requests <= 1.1 * pages()`` (only the killed slice's pages are redone).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import ExitStack
from datetime import datetime, timezone

import pytest
from conftest import LAGGING, MUSEUM, AirflowStack  # pytest (prepend mode) puts tests/e2e on sys.path

from celery_stack import (
    CeleryWorker,
    GatedOaiSimulator,
    celery_env,
    celery_workers,
    redis_broker,
    worker_logs_on_failure,
)
from include.simulators.oai_pmh import SimulatedRepository
from partner_harvest.store import connect, ensure_schema
from partner_harvest.store.admin import live_identifiers

pytestmark = pytest.mark.e2e

# Two registry entries of the shared fixture (plain OAI-PMH partners), pointed by their
# Connections at this module's gated simulators.
PARTNERS = (MUSEUM, LAGGING)
HOSTNAMES = ("worker-a", "worker-b")
CONCURRENCY = 1  # one task per worker: two chains running at once are on two workers
RECORDS, PAGE_SIZE = 1500, 100  # 15 pages a chain: cheap, and a page-3 kill is mid-chain
HELD_AT = 3  # the third ListRecords request waits: two pages are staged when the worker dies
RUN_TIMEOUT = 180.0


@pytest.fixture(scope="module")
def broker_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with redis_broker(tmp_path_factory.mktemp("redis")) as url:
        yield url


@pytest.fixture(scope="module")
def gated() -> Iterator[dict[str, GatedOaiSimulator]]:
    now = datetime.now(timezone.utc).replace(microsecond=0)
    with ExitStack() as stack:
        simulators: dict[str, GatedOaiSimulator] = {}
        for seed, partner in enumerate(PARTNERS, start=21):
            repo = SimulatedRepository(records=RECORDS, page_size=PAGE_SIZE, seed=seed, start_clock=now)
            simulators[partner] = stack.enter_context(GatedOaiSimulator(repo))
            stack.callback(simulators[partner].release)  # no request stays held at the server's stop
        yield simulators


@pytest.fixture(scope="module")
def airflow_env_overrides(broker_url: str, gated: dict[str, GatedOaiSimulator]) -> dict[str, str]:
    """conftest's stack, on the CeleryExecutor, its partners' Connections at the gated simulators."""
    env = celery_env(broker_url, CONCURRENCY)
    for partner, simulator in gated.items():
        env[f"AIRFLOW_CONN_PARTNER_{partner.upper()}"] = json.dumps({"conn_type": "http", "host": simulator.base_url})
    return env


@pytest.fixture(scope="module")
def workers(airflow_stack: AirflowStack, broker_url: str,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[CeleryWorker]]:
    with celery_workers(airflow_stack.env, tmp_path_factory.mktemp("workers"), HOSTNAMES, CONCURRENCY,
                        broker_url) as started:
        yield started


def held(stack: AirflowStack, partner: str) -> set[str]:
    with connect(stack.aggregation_db) as conn:
        ensure_schema(conn)
        return live_identifiers(conn, partner)


def ti_path(dag_id: str, run_id: str, task_id: str, map_index: int | None = None) -> str:
    """The REST path of a task instance (a mapped one by its map index)."""
    index = "" if map_index is None else f"/{map_index}"
    return f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}{index}"


def running_on(stack: AirflowStack, dag_id: str, run_id: str, task_id: str,
               map_index: int | None = None) -> str | None:
    """The hostname of the worker running the task instance now (None until it runs)."""
    ti = stack.api("GET", ti_path(dag_id, run_id, task_id, map_index))
    return ti["hostname"] if ti["state"] == "running" and ti["hostname"] else None


def tries(stack: AirflowStack, dag_id: str, run_id: str, task_id: str,
          map_index: int | None = None) -> list[tuple[int, str, str]]:
    """(try number, hostname, state) of every try of the task instance, in order."""
    found = stack.api("GET", ti_path(dag_id, run_id, task_id, map_index) + "/tries")["task_instances"]
    return sorted((t["try_number"], t["hostname"], t["state"]) for t in found)


def test_a_killed_workers_harvest_is_retried_on_the_other_worker_and_lands_exactly(
    airflow_stack: AirflowStack, workers: list[CeleryWorker], gated: dict[str, GatedOaiSimulator],
) -> None:
    with worker_logs_on_failure(workers):
        check_killed_worker(airflow_stack, workers, gated)


def check_killed_worker(stack: AirflowStack, workers: list[CeleryWorker],
                        gated: dict[str, GatedOaiSimulator]) -> None:
    by_host = {worker.hostname: worker for worker in workers}
    for simulator in gated.values():
        simulator.hold_list_requests(HELD_AT)
    runs = {partner: stack.trigger(f"harvest_{partner}", {"mode": "full"})["dag_run_id"] for partner in PARTNERS}

    def dead_workers() -> None:
        for worker in workers:
            if worker.process.poll() is not None and worker is not victim:
                raise RuntimeError(f"worker {worker.hostname} died\n{worker.log_tail()}")

    victim: CeleryWorker | None = None
    hosts: dict[str, str] = {}
    for partner in PARTNERS:
        stack.poll(lambda partner=partner: (dead_workers(), gated[partner].held.is_set())[1], RUN_TIMEOUT,
                   f"{partner}'s harvest to ask for page {HELD_AT}")
        hosts[partner] = stack.poll(lambda partner=partner: running_on(stack, f"harvest_{partner}", runs[partner],
                                                                       "harvest_changes"),
                                    30, f"{partner}'s harvest_changes to show its worker")
    # Both chains are in flight at once, one slot per worker: they run on both workers.
    assert sorted(hosts.values()) == sorted(HOSTNAMES), hosts

    target = PARTNERS[0]
    victim = by_host[hosts[target]]
    survivor = next(worker for worker in workers if worker is not victim)
    victim.kill()  # the machine is gone, mid-chain: two pages staged, the third in flight
    for simulator in gated.values():
        simulator.release()

    for partner in PARTNERS:
        dag_id, run_id = f"harvest_{partner}", runs[partner]
        done = stack.wait_for_run(dag_id, run_id, timeout=RUN_TIMEOUT)
        assert done["state"] == "success", stack.task_summary(dag_id, run_id)
        # Exact, on both partners: the dead try's staged pages neither doubled nor lost anything.
        assert held(stack, partner) == gated[partner].repo.live_identifiers()

    killed = tries(stack, f"harvest_{target}", runs[target], "harvest_changes")
    assert [(number, host) for number, host, _ in killed] == [(1, victim.hostname), (2, survivor.hostname)], killed
    assert killed[0][2] != "success" and killed[1][2] == "success", killed
    other = tries(stack, f"harvest_{PARTNERS[1]}", runs[PARTNERS[1]], "harvest_changes")
    assert [(number, host, state) for number, host, state in other] == [(1, survivor.hostname, "success")], other

    # Pages: the dead try's HELD_AT requests, then one whole chain (today's harvest is one
    # chain per partner; a retry starts it over). The other partner's chain was never redone.
    assert gated[target].list_requests == HELD_AT + gated[target].pages()
    assert gated[PARTNERS[1]].list_requests == gated[PARTNERS[1]].pages()
