"""A try whose worker died may keep running beside Airflow's retry (Celery e2e finding).

Airflow gives each task process its own process group: when a Celery worker is killed,
its task process can survive and go on harvesting the same run's channel while the
retry, on another worker, already started over. Both wrote one channel's staging: the
orphan's later pages landed among the retry's (staged != fetched, or its ``fetched``
overwrote the retry's), and its failure could mark the retry's row failed. Each try now
carries its attempt number and every write checks it (store/runs.check_attempt).
"""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import Any

import psycopg
import pytest

from include.simulators.loopback import Response
from include.simulators.oai_pmh import OaiSimulator, SimulatedRepository
from partner_harvest import pipeline
from partner_harvest.factory import Endpoint, build_adapter
from partner_harvest.records import HarvestStats
from partner_harvest.store import RunRef, StagingWriter, apply_run, begin_run, connect, finish_harvest
from partner_harvest.store.admin import live_identifiers
from partner_harvest.store.db import one
from partner_harvest.store.runs import AttemptSuperseded, fail_run
from tests.support.partners import oai_partner
from tests.support.records import T0, WINDOW, rec
from tests.support.records import live_titles as live


def test_a_superseded_try_can_no_longer_write_fail_or_finish_its_channel(conn: psycopg.Connection) -> None:
    run = RunRef("p", "r1")
    orphan = begin_run(conn, run, WINDOW, "oai_dc")
    StagingWriter(conn, run, attempt=orphan).write_page([rec("x", T0, "orphan page 1")])
    retry = begin_run(conn, run, WINDOW, "oai_dc")  # Airflow's retry on the other worker
    StagingWriter(conn, run, attempt=retry).write_page([rec("y", T0, "retry")])
    with pytest.raises(AttemptSuperseded):
        StagingWriter(conn, run, attempt=orphan).write_page([rec("z", T0, "orphan page 2")])
    conn.rollback()
    fail_run(conn, run, "the orphan's own failure", orphan)  # must not touch the retry's row
    finish_harvest(conn, run, HarvestStats(pages=1, fetched=1, records=1), retry)
    with pytest.raises(AttemptSuperseded):
        finish_harvest(conn, run, HarvestStats(pages=2, fetched=2, records=2), orphan)
    conn.rollback()
    assert apply_run(conn, "p", "r1").upserted == 1
    assert live(conn) == {"y": "retry"}


def test_an_orphaned_harvest_stops_at_its_next_page_and_the_retry_applies_exactly(
        db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the pipeline against the simulator: the orphan is held at its third page
    while the retry harvests the whole window; released, it stops without writing."""
    repo = SimulatedRepository(records=300, page_size=50, seed=4)
    with OaiSimulator(repo) as sim:
        held, release = threading.Event(), threading.Event()
        original, asked = sim.handle_oai, {"lists": 0}

        def gated(pairs: list[tuple[str, str]]) -> Response:
            if any(k == "verb" and v == "ListRecords" for k, v in pairs):
                asked["lists"] += 1
                if asked["lists"] == 3:  # the orphan's third page: its worker is lost here
                    held.set()
                    release.wait(30)
            return original(pairs)

        monkeypatch.setattr(sim, "handle_oai", gated)
        p = oai_partner(retries=3)
        adapter = build_adapter(p, Endpoint(sim.base_url))
        window = pipeline.freeze_window(adapter, p.lag, None, pipeline.RunRequest("incremental"))
        run = RunRef(p.id, "harvest_museum/r1")
        failure: list[BaseException] = []

        def orphan() -> None:
            with connect(db) as own:
                try:
                    pipeline.harvest_window(build_adapter(p, Endpoint(sim.base_url)), own, run, window)
                except BaseException as exc:  # noqa: BLE001 - the test inspects it
                    failure.append(exc)

        thread = threading.Thread(target=orphan)
        thread.start()
        assert held.wait(30)
        with connect(db) as conn:
            stats = pipeline.harvest_window(adapter, conn, run, replace(window))  # the retry, whole
            release.set()
            thread.join(30)
            assert failure and isinstance(failure[0], AttemptSuperseded), failure
            applied = pipeline.apply_changes(conn, p.id, run.run_id)
            assert applied.fetched == stats.fetched
            assert live_identifiers(conn, p.id) == repo.live_identifiers()
            assert conn.execute("SELECT status, attempts FROM harvest_runs WHERE run_id = %s",
                                (run.run_id,)).fetchone() == ("applied", 2)


def test_an_orphaned_tries_completeness_check_never_replaces_the_retrys(conn: psycopg.Connection) -> None:
    """record_check was not fenced: an orphan finishing late overwrote the retry's verdict."""
    from partner_harvest.store import record_check

    run = RunRef("p", "r", "changes")
    orphan = begin_run(conn, run, WINDOW, "oai_dc")
    retry = begin_run(conn, run, WINDOW, "oai_dc")
    assert retry == orphan + 1
    record_check(conn, run, "list_identifiers", 10, 10, True, "complete", attempt=retry)
    record_check(conn, run, "list_identifiers", 10, 3, False, "7 missing", attempt=orphan)
    assert conn.execute("SELECT check_ok, check_found, check_detail FROM harvest_runs").fetchone() == (True, 10, "complete")


class _TaskTimeout(BaseException):
    """Stands in for Airflow's AirflowTaskTimeout, which is a BaseException, not an Exception."""


def test_a_try_ended_by_its_task_timeout_marks_its_channel_failed(conn: psycopg.Connection,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by the 50,000-object IIIF soak: a harvest over its execution_timeout left its row
    'harvesting', so the failure callback took the run for still working, kept the lease to
    its TTL and the health page showed the run as running."""
    from partner_harvest.store.runs import channels_still_harvesting

    repo = SimulatedRepository(records=30, page_size=10, seed=5)
    with OaiSimulator(repo) as sim:
        p = oai_partner()
        adapter = build_adapter(p, Endpoint(sim.base_url))
        window = pipeline.freeze_window(adapter, p.lag, None, pipeline.RunRequest("incremental"))

        def timed_out(*args: Any, **kwargs: Any) -> None:
            raise _TaskTimeout("Timeout, PID: 1")

        monkeypatch.setattr(adapter, "harvest", timed_out)
        run = RunRef(p.id, "harvest_museum/timeout")
        with pytest.raises(_TaskTimeout):
            pipeline.harvest_window(adapter, conn, run, window)
    assert channels_still_harvesting(conn, p.id, run.run_id) == []
    status, error = one(conn.execute("SELECT status, error FROM harvest_runs WHERE run_id = %s", (run.run_id,)))
    assert (status, error) == ("failed", "_TaskTimeout: Timeout, PID: 1")
