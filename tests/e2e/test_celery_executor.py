"""A sliced full harvest on the CeleryExecutor: a real Redis broker and two Celery workers on loopback.

What the LocalExecutor stack cannot show: the slices of one run (mapped ``harvest_changes``
instances) running on different machines that share nothing but the databases and the
broker, and a slice whose worker died retried by Airflow on the other one, with the
aggregation still exactly the partner's live set.

The museum partner's registry entry is sliced here (``slicing`` below: RECORDS split in two
slices); with one slot per worker, the two slices in flight at once run one on each worker.
The gated simulator holds every chain at its second ListRecords request (one page staged,
the next in flight), so the test knows where each slice stands when it kills a worker.

The worker is killed the way ``kill -9 -<pgid>`` kills it: its process group only. Airflow
puts each task runner in a group of its own, so the killed slice's runner lives on as an
orphan, blocked on its held request. It is let go only once the retry began (the slice's
``harvest_runs.attempts`` is 2): it must then stop at its next page (the attempt fence,
store/runs.check_attempt) instead of mixing its pages into the retry's staging.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from include.simulators.oai_pmh import SimulatedRepository
from partner_harvest.store import connect
from partner_harvest.store.slices import is_slice, slice_channel, slice_rows
from tests.support.celery_stack import (
    CeleryWorker,
    GatedOaiSimulator,
    celery_env,
    celery_workers,
    end_orphans,
    redis_broker,
    worker_logs_on_failure,
)
from tests.support.db import held as held_in
from tests.support.e2e_stack import MUSEUM, AirflowStack, write_registry

pytestmark = pytest.mark.e2e

PARTNER = MUSEUM  # a plain OAI-PMH entry of the shared registry, sliced in this module's copy of it
DAG_ID = f"harvest_{PARTNER}"
HOSTNAMES = ("worker-a", "worker-b")
CONCURRENCY = 1  # one task per worker: two slices running at once are on two workers
RECORDS, PAGE_SIZE = 3000, 50  # 60 pages: a redone page or two stay inside 1.1x the collection
SLICES = 2
SLICING = {"threshold_records": 2000, "target_records": 1000, "max_slices": SLICES}
KILLED_TRY_REQUESTS = 2  # the killed slice's first page (staged) and its held second request
RUN_TIMEOUT = 180.0
ORPHAN_EXIT_TIMEOUT = 60.0


@pytest.fixture(scope="module")
def broker_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with redis_broker(tmp_path_factory.mktemp("redis")) as url:
        yield url


@pytest.fixture(scope="module")
def gated() -> Iterator[GatedOaiSimulator]:
    now = datetime.now(timezone.utc).replace(microsecond=0)
    repo = SimulatedRepository(records=RECORDS, page_size=PAGE_SIZE, seed=21, start_clock=now)
    with GatedOaiSimulator(repo) as simulator:
        try:
            yield simulator
        finally:
            simulator.release()  # no request stays held at the server's stop


@pytest.fixture(scope="module")
def sliced_registry(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The e2e registry, the museum entry sliced (and two pool slots: both slices at once)."""
    path = tmp_path_factory.mktemp("registry") / "partners.yaml"
    write_registry(path)
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    entry = next(p for p in data["partners"] if p["id"] == PARTNER)
    entry.update(slicing=SLICING, pool_slots=SLICES)
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def airflow_env_overrides(broker_url: str, gated: GatedOaiSimulator, sliced_registry: Path) -> dict[str, str]:
    """The e2e stack, on the CeleryExecutor, the museum's Connection at the gated simulator."""
    env = celery_env(broker_url, CONCURRENCY)
    env[f"AIRFLOW_CONN_PARTNER_{PARTNER.upper()}"] = json.dumps({"conn_type": "http", "host": gated.base_url})
    env["HARVEST_PARTNERS_FILE"] = str(sliced_registry)
    return env


@pytest.fixture(scope="module")
def workers(airflow_stack: AirflowStack, broker_url: str,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[CeleryWorker]]:
    with celery_workers(airflow_stack.env, tmp_path_factory.mktemp("workers"), HOSTNAMES, CONCURRENCY,
                        broker_url) as started:
        yield started


def held(stack: AirflowStack, partner: str) -> set[str]:
    return held_in(stack.aggregation_db, partner)


def slices_of(stack: AirflowStack, run_key: str) -> dict[str, dict[str, Any]]:
    """The run's slice rows in harvest_runs, by channel."""
    with connect(stack.aggregation_db) as conn:
        return {row["channel"]: row for row in slice_rows(conn, PARTNER, run_key) if is_slice(row["channel"])}


def oai_until(value: datetime) -> str:
    """A slice's upper bound as its ListRecords request carries it (seconds granularity)."""
    return value.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def ti_path(dag_id: str, run_id: str, task_id: str, map_index: int | None = None) -> str:
    """The REST path of a task instance (a mapped one by its map index)."""
    index = "" if map_index is None else f"/{map_index}"
    return f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}{index}"


def running_slices(stack: AirflowStack, run_id: str) -> dict[int, tuple[str, str]]:
    """map_index -> (hostname, channel) of every harvest_changes instance running now.

    The channel is the plan's piece at that index (the name the grid shows, rendered only
    once the instance ends)."""
    found = stack.api("GET", ti_path(DAG_ID, run_id, "harvest_changes") + "/listMapped")["task_instances"]
    return {ti["map_index"]: (ti["hostname"], slice_channel(ti["map_index"] + 1)) for ti in found
            if ti["state"] == "running" and ti["hostname"]}


def tries(stack: AirflowStack, dag_id: str, run_id: str, task_id: str,
          map_index: int | None = None) -> list[tuple[int, str, str]]:
    """(try number, hostname, state) of every try of the task instance, in order."""
    found = stack.api("GET", ti_path(dag_id, run_id, task_id, map_index) + "/tries")["task_instances"]
    return sorted((t["try_number"], t["hostname"], t["state"]) for t in found)


def test_a_sliced_harvest_runs_on_both_workers_and_a_killed_slice_is_retried_on_the_other(
    airflow_stack: AirflowStack, workers: list[CeleryWorker], gated: GatedOaiSimulator,
) -> None:
    orphans: list[Any] = []
    try:
        with worker_logs_on_failure(workers):
            check_sliced_harvest(airflow_stack, workers, gated, orphans)
    finally:
        end_orphans(orphans)  # whatever the fence did not stop (never a leaked process)


def check_sliced_harvest(stack: AirflowStack, workers: list[CeleryWorker], sim: GatedOaiSimulator,
                         orphans: list[Any]) -> None:
    by_host = {worker.hostname: worker for worker in workers}
    victim: CeleryWorker | None = None

    def alive() -> bool:
        for worker in workers:
            if worker.process.poll() is not None and worker is not victim:
                raise RuntimeError(f"worker {worker.hostname} died\n{worker.log_tail()}")
        return True

    sim.hold_continuations()
    run_id = stack.trigger(DAG_ID, {"mode": "full"})["dag_run_id"]
    run_key = f"{DAG_ID}/{run_id}"

    # Both slices stand at their second page, each on a worker of its own.
    stack.poll(lambda: alive() and len(sim.held_chains()) == SLICES, RUN_TIMEOUT,
               f"{SLICES} slices' chains to ask for their second page")
    running = stack.poll(lambda: (lambda r: r if len(r) == SLICES else None)(running_slices(stack, run_id)),
                         30, f"{SLICES} running harvest_changes instances with their workers")
    assert sorted(host for host, _ in running.values()) == sorted(HOSTNAMES), running
    rows = slices_of(stack, run_key)
    assert sorted(rows) == sorted(channel for _, channel in running.values()), (rows.keys(), running)

    killed_index = min(running)
    victim_host, victim_channel = running[killed_index]
    victim = by_host[victim_host]
    survivor = next(worker for worker in workers if worker is not victim)
    victim_until = oai_until(rows[victim_channel]["window_until"])
    victim_chain = next(chain for chain, until in sim.held_chains().items() if until == victim_until)

    orphans.extend(victim.kill(spare_task_runners=True))  # mid-slice: one page staged, the second in flight
    assert orphans, "the killed worker left no task runner behind: nothing tests the attempt fence"
    for chain in sim.held_chains():
        if chain != victim_chain:
            sim.release_chain(chain)  # the survivor's slice goes on; the orphan stays held

    # The retry: try 2 of the killed slice on the survivor, begun (attempts 2) and at the gate.
    def retry_held() -> bool:
        alive()
        retry = [chain for chain, until in sim.held_chains().items() if until == victim_until and chain != victim_chain]
        return bool(retry) and slices_of(stack, run_key)[victim_channel]["attempts"] == 2

    stack.poll(retry_held, RUN_TIMEOUT, f"the retry of {victim_channel} to begin and ask for its second page")
    assert all(orphan.is_running() for orphan in orphans), "the orphan died before the fence was tested"
    sim.release()  # now the orphan's page comes back: try 1 is superseded, it must stop there
    gone, still = psutil.wait_procs(orphans, timeout=ORPHAN_EXIT_TIMEOUT)
    assert not still, f"orphaned task runner(s) {[p.pid for p in still]} still running after the fence"

    done = stack.wait_for_run(DAG_ID, run_id, timeout=RUN_TIMEOUT)
    assert done["state"] == "success", stack.task_summary(DAG_ID, run_id)
    assert held(stack, PARTNER) == sim.repo.live_identifiers()

    # Hostnames per map_index: the killed slice's try 1 on the dead worker, try 2 on the survivor.
    by_index = {index: tries(stack, DAG_ID, run_id, "harvest_changes", index) for index in running}
    killed = by_index[killed_index]
    assert [(n, host) for n, host, _ in killed] == [(1, victim.hostname), (2, survivor.hostname)], by_index
    assert killed[0][2] != "success" and killed[1][2] == "success", by_index
    for index, other in by_index.items():
        if index != killed_index:
            assert other == [(1, survivor.hostname, "success")], by_index
    # The apply found every slice's staging equal to its fetched count (no StagingIncomplete,
    # which would reharvest the slice inside the apply: a third attempt): one try.
    assert [state for _, _, state in tries(stack, DAG_ID, run_id, "apply_changes")] == ["success"]
    rows = slices_of(stack, run_key)
    summary = {channel: (row["status"], row["attempts"], row["pages"], row["fetched"]) for channel, row in rows.items()}
    assert {channel: status_attempts[:2] for channel, status_attempts in summary.items()} == {
        channel: ("applied", 2 if channel == victim_channel else 1) for channel in rows}, summary
    assert sum(row["fetched"] for row in rows.values()) == sim.repo.counts()["total"], summary

    # Requests: every slice's chain once, plus the killed try's two, plus at most one page the
    # orphan's pipelined fetcher asked for before its next write met the attempt fence;
    # within 1.1x the collection's pages.
    slice_pages = sum(row["pages"] for row in rows.values())
    assert slice_pages + KILLED_TRY_REQUESTS <= sim.list_requests <= slice_pages + KILLED_TRY_REQUESTS + 1, (
        sim.list_requests, slice_pages)
    assert sim.list_requests <= 1.1 * sim.pages(), (sim.list_requests, sim.pages())
    print(f"\nsliced Celery e2e: {len(rows)} slices {sorted(running.values())}; killed {victim_channel} on "
          f"{victim.hostname}, retried on {survivor.hostname}; ListRecords {sim.list_requests} for "
          f"{sim.pages()} pages ({sim.list_requests / sim.pages():.3f}x), slice chains {slice_pages}; "
          f"plan probes (ListIdentifiers) {sim.identifier_requests}: with them "
          f"{(sim.list_requests + sim.identifier_requests) / sim.pages():.3f}x")
