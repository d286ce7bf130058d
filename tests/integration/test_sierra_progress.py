"""An unsliced Sierra full load (the bibs/marc export) shows an expected total
and a time left, in `partner-harvest progress`, on the health page's "Running now" and in the
task log, as a sliced load and an OAI-PMH list do.

Sierra's ``total`` is the size of one page, so the estimate is the span of bib ids (probes of
``fields=id&limit=1``), an upper bound: deleted ids count. The export never stops on it: a
catalogue larger than the estimate (bibs added during the load) is exported whole.
Sierra simulator on loopback, real PostgreSQL.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest

from include.simulators.sierra import Response, SierraSimulator, SimulatedCatalogue
from partner_harvest import pipeline
from partner_harvest.cli import main
from partner_harvest.factory import Endpoint, build_adapter
from partner_harvest.records import HarvestStats
from partner_harvest.registry import Partner
from partner_harvest.store import RunRef, connect
from partner_harvest.store.db import one
from partner_harvest.store.progress import current_progress, summary_line

KEY, SECRET = "demo-key", "s3cr3t-demo-secret"
BIBS, BLOCK = 600, 100


def library() -> Partner:
    return Partner(id="library", protocol="sierra", conn_id="unused", page_size=50, options={
        "http": {"backoff_factor": 0.01, "backoff_max": 0.05, "retries": 2, "read_timeout": 30},
        "sierra": {"server_error_backoff": 0.01, "server_error_tries": 3},
        "export": {"limit": BLOCK, "rate_limit_wait": 0},
    })


def full_load(conn: psycopg.Connection, sim: SierraSimulator, run_id: str = "harvest_library/full-1") -> HarvestStats:
    adapter = build_adapter(library(), Endpoint(sim.base_url, KEY, SECRET))
    window = pipeline.freeze_window(adapter, library().lag, None, pipeline.RunRequest("full"), {"deletions": None})
    assert window.protocol.slice is None  # unsliced: the run's one channel is the whole export
    return pipeline.harvest_window(adapter, conn, RunRef("library", run_id, "changes"), window)


def partner_page(db: str, monkeypatch: pytest.MonkeyPatch) -> Callable[[], str]:
    """The partner health page (the app the api-server mounts) on this test's database."""
    from pathlib import Path

    from fastapi.testclient import TestClient

    from partner_harvest.airflow.health import app as health_app
    from partner_harvest.airflow.health import source
    from partner_harvest.registry import Registry

    registry = Registry(Path("partners.yaml"), [library()], [])
    monkeypatch.setattr(source, "registry", lambda: registry)
    monkeypatch.setattr(source, "latest_harvest_runs", lambda partners: {})
    monkeypatch.setattr(source, "connection", lambda: connect(db))
    monkeypatch.setattr(health_app, "_require_user", lambda: (lambda: None))  # Airflow's login: test_health.py
    client = TestClient(health_app.create_app())
    return lambda: client.get("/partner/library").text


@contextmanager
def task_log(name: str) -> Iterator[list[str]]:
    """The messages of logger ``name`` (Airflow's logging setup, once the health app is imported,
    keeps records from pytest's caplog)."""
    messages: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            messages.append(record.getMessage())

    logger, handler = logging.getLogger(name), Keep(logging.INFO)
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield messages
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def test_an_unsliced_full_load_shows_its_expected_total_and_time_left(conn: psycopg.Connection, db: str,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    catalogue = SimulatedCatalogue(bibs=BIBS, deleted_fraction=0.05, seed=8)
    page = partner_page(db, monkeypatch)
    seen, pages = [], []
    with SierraSimulator(catalogue, client_key=KEY, client_secret=SECRET) as sim:
        observer = connect(db)
        original = sim._export

        def watch(params: Mapping[str, str]) -> Response:  # before answering each export block: what does an operator see?
            progress = current_progress(observer, "library")
            if progress is not None and progress.fetched:
                seen.append((progress, summary_line(progress)))
                if len(seen) == 2:
                    pages.append(page())
            return original(params)

        monkeypatch.setattr(sim, "_export", watch)
        try:
            with task_log("partner_harvest.sierra") as messages:  # the adapter and its export
                stats = full_load(conn, sim)
        finally:
            observer.close()
    assert stats.fetched == len(catalogue.live_ids())

    # While it ran: a total to expect and a time left, from another connection (as the page and CLI read).
    assert len(seen) >= 3, seen
    for progress, line in seen:
        assert progress.expected is not None and progress.expected >= len(catalogue.live_ids()), line
        assert progress.time_left is not None, line
        assert re.search(rf": [\d,]+ of {progress.expected:,} records, [\d,]+/s now, time left \d+[dhms]", line), line
    assert {p.expected for p, _ in seen} == {BIBS}  # the id span: 5% of it deleted bibs, an upper bound

    (running,) = pages  # the health page's "Running now": the same line, and the channel's expected and time left
    assert "Running now" in running and re.search(rf" of {BIBS:,} records, [\d,]+/s now, time left \d+[dhms]", running)
    row = running[running.index('<table id="progress">'):].split("</tr>")[1]
    assert f'<td class="num">{BIBS}</td>' in row and re.search(r'<td class="num">\d+[dhms]( \d+[hms])?</td>', row), row

    # The task log: which estimate it is, then of ~N and the time left on the export's pages.
    (said,) = [m for m in messages if "full load expects about" in m]
    expected = seen[0][0].expected
    assert f"full load expects about {expected} bibs: an estimate from the id range " in said
    assert "Sierra's total counts only a page" in said and "never to end the export" in said
    blocks = [m for m in messages if ": export page " in m]
    assert blocks and all(f" of ~{expected} (id range) (" in m for m in blocks), blocks
    assert all(re.search(r"/s, about \d+[dhms]( \d+[hms])? left$", m) for m in blocks[:-1]), blocks


def test_the_estimate_never_ends_the_export(conn: psycopg.Connection, db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Bibs added after the estimate (ids above its range) still land: the export ends on
    404/107 or an empty block, not when the estimate is reached."""
    catalogue = SimulatedCatalogue(bibs=BIBS, deleted_fraction=0.0, seed=9)
    with SierraSimulator(catalogue, client_key=KEY, client_secret=SECRET) as sim:
        original = sim._export
        grown: list[str] = []

        def grow(params: Mapping[str, str]) -> Response:
            if not grown:  # the first block: the estimate is made; the catalogue grows past it
                grown.extend(catalogue.add(150))
            return original(params)

        monkeypatch.setattr(sim, "_export", grow)
        stats = full_load(conn, sim)
    row = one(conn.execute("SELECT expected, fetched FROM harvest_runs WHERE run_id = 'harvest_library/full-1'"))
    conn.commit()
    assert row[0] == BIBS and stats.fetched == row[1] == BIBS + 150  # expected 600, came 750


def test_progress_prints_the_expected_total_of_an_unsliced_full_load(conn: psycopg.Connection, db: str, capsys: pytest.CaptureFixture[str],
                                                                     tmp_path: Path) -> None:
    registry = tmp_path / "partners.yaml"
    registry.write_text("partners:\n  - {id: library, protocol: sierra, conn_id: unused}\n", encoding="utf-8")
    catalogue = SimulatedCatalogue(bibs=BIBS, deleted_fraction=0.0, seed=10)
    with SierraSimulator(catalogue, client_key=KEY, client_secret=SECRET) as sim:
        full_load(conn, sim)
    assert main(["progress", "library", "--registry", str(registry), "--database-url", db]) == 0
    out = capsys.readouterr().out.splitlines()
    changes = next(line for line in out[2:] if line.startswith("changes "))
    assert changes.split()[1] == "harvested"
    assert changes[out[0].index("expected"):].split()[0] == str(BIBS)  # the estimate the load wrote: the id span
    assert changes[out[0].index("done"):].split()[0] == "100%"
    assert out[-1].startswith(f"run harvest_library/full-1: {BIBS:,} of {BIBS:,} records")
