"""A partner publishing dated CSV dumps and deltas, end to end: the publisher simulator
writing to a local folder, an S3-compatible server on loopback (moto) or a folder served as
an HTTP directory; real PostgreSQL; each day one DAG run through partner_harvest.run.

The days: a full dump; a delta; a delta that is late (written, its done-marker not yet); the
next day's delta beside it; the late marker; the delta re-uploaded in place with other
content; a delta with deletions; a new full dump missing records no delta deleted. After
every day ``records`` holds what the deliveries published so far say the partner holds,
each delivery applied once (the re-uploaded one twice), the late one waited for.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import fsspec
import psycopg
import pytest

from include.simulators.files.publisher import Publisher
from include.simulators.files.server import DirectoryServer
from partner_harvest.run import RunResult
from partner_harvest.window import DeliveryFacts
from tests.support.files_harness import FilesHarness, files_partner
from tests.support.s3 import KEY, SECRET, moto_endpoint, moto_s3  # noqa: F401 (fixtures)

DAY0 = datetime(2026, 6, 15, tzinfo=timezone.utc)


def day(n: int) -> datetime:
    return DAY0 + timedelta(days=n)


class Place:
    """Where the publisher writes and how the partner's Connection reaches it."""

    def __init__(self, fs: Any, root: str, url: str, login: str | None = None, password: str | None = None,
                 extra: dict[str, Any] | None = None, server: Any = None):
        self.fs, self.root, self.url = fs, root, url
        self.login, self.password, self.extra, self.server = login, password, extra or {}, server


@pytest.fixture(params=["local", "http", "s3"])
def place(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Place]:
    local = fsspec.filesystem("file")
    folder = tmp_path / "dumps"
    folder.mkdir()
    if request.param == "local":
        yield Place(local, str(folder), f"file://{folder}")
    elif request.param == "http":
        with DirectoryServer(folder) as server:
            yield Place(local, str(folder), f"{server.base_url}/", server=server)
    else:
        moto = request.getfixturevalue("moto_s3")
        yield Place(moto.fs, f"{moto.bucket}/museum", f"s3://{moto.bucket}/museum", KEY, SECRET,
                    {"endpoint_url": moto.endpoint})


def test_dumps_and_deltas_day_by_day(place: Place, conn: psycopg.Connection) -> None:
    museum = Publisher(place.fs, place.root)
    harness = FilesHarness(place.url, conn, files_partner(), login=place.login, password=place.password,
                           extra=place.extra)

    museum.create(60)
    museum.full(day(0), parts=2)
    first = harness.run()
    assert harness.held() == museum.published_ids() and len(harness.held()) == 60
    assert first.applied.upserted == 60 and first.applied.quarantined == 0
    assert harness.cursor == day(0)

    museum.edit(5)
    museum.create(3)
    museum.delete(2)
    museum.delta(day(1))
    harness.run()
    assert harness.held() == museum.published_ids()
    assert harness.cursor == day(1)

    # Day 2's delta is written, its done-marker is not: it waits.
    museum.edit(4)
    museum.delete(1)
    museum.delta(day(2), marker=False)
    after_day1 = held_now = harness.held()
    waited = harness.run()
    assert waited.changes.fetched == 0 and harness.cursor == day(1)
    assert "not complete" in (frozen(waited).waiting or "")
    assert harness.held() == held_now

    # Day 3's delta arrives complete while day 2's is still missing its marker: still waiting.
    museum.edit(2)
    museum.create(2)
    museum.delta(day(3))
    assert harness.run().changes.fetched == 0 and harness.held() == after_day1

    # Day 2's marker comes late: days 2 and 3 apply, in date order, in one run.
    museum.mark_done(day(2))
    caught_up = harness.run()
    assert harness.held() == museum.published_ids()
    assert [d.date for d in frozen(caught_up).deliveries] == [day(2), day(3)]
    assert harness.cursor == day(3)

    # Day 3's delta re-uploaded in place with other content: applied again, and only it.
    edited = museum.reupload_delta(day(3), edits=3)
    again = harness.run()
    assert [d.date for d in frozen(again).deliveries] == [day(3)], edited
    assert harness.held() == museum.published_ids()
    assert titles(conn, harness) == {i: r["title"] for i, r in museum.published.items()}

    # A quiet day: nothing new, nothing applied.
    assert harness.run().changes.fetched == 0

    # Day 4: a delta of deletions.
    gone = museum.delete(6)
    museum.delta(day(4))
    deleted = harness.run()
    assert deleted.applied.purged == 6 and not set(gone) & harness.held()

    # Day 5: a full dump that lacks records no delta deleted: they are purged (not_listed).
    silently = museum.delete(4, announce=False)
    museum.edit(2)
    museum.full(day(5), parts=3)
    full = harness.run()
    assert harness.held() == museum.published_ids() and not set(silently) & harness.held()
    assert full.window.protocol.whole_list_at == day(5)
    assert reasons(conn, harness) == {"not_listed": 4}

    applied = harness.applied_deliveries()
    dates = [(date, kind) for _, date, kind in applied]
    assert dates.count(("20260618", "delta")) == 2  # the re-upload
    assert len(dates) == len(set(dates)) + 1  # every other delivery once
    assert {d for d in set(dates)} == {(d, k) for d, k in museum.deliveries}
    assert harness.cursor == day(5)


def frozen(result: RunResult) -> DeliveryFacts:
    """The deliveries a run froze (and why it waits)."""
    assert result.window.protocol.files is not None
    return result.window.protocol.files


def titles(conn: psycopg.Connection, harness: FilesHarness) -> dict[str, str]:
    rows = conn.execute("SELECT identifier, title FROM records WHERE partner_id = %s", (harness.partner.id,)).fetchall()
    conn.commit()
    return dict(rows)


def reasons(conn: psycopg.Connection, harness: FilesHarness) -> dict[str, int]:
    """Why the last run purged what it purged (deletions.reason)."""
    rows = conn.execute("SELECT reason, count(*) FROM deletions WHERE partner_id = %s AND run_id = %s GROUP BY 1",
                        (harness.partner.id, f"run-{harness.runs}")).fetchall()
    conn.commit()
    return dict(rows)


class Killed(Exception):
    """The worker died here (a BaseException in Airflow; any exception ends the try alike)."""


def test_a_try_killed_inside_a_file_resumes_at_its_checkpoint(tmp_path: Path, conn: psycopg.Connection,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from partner_harvest import run
    from partner_harvest.files import harvester

    folder = tmp_path / "dumps"
    museum = Publisher(fsspec.filesystem("file"), str(folder))
    museum.create(5000)
    museum.full(day(0))
    harness = FilesHarness(f"file://{folder}", conn, files_partner())
    window = harness.freeze()
    monkeypatch.setattr(harvester, "PAGE_ITEMS", 500)
    real_flush = harvester.FileDeliveryAdapter._flush
    flushed: list[int] = []

    def dying(self: Any, page: Any, sink: Any, stats: Any, at: int) -> None:  # the fourth page never lands
        if len(flushed) == 3:
            raise Killed("worker lost")
        flushed.append(at)
        real_flush(self, page, sink, stats, at)

    monkeypatch.setattr(harvester.FileDeliveryAdapter, "_flush", dying)
    with pytest.raises(Killed):
        run.stage_channel(harness.adapter(), conn, "run-1", window, run.CHANGES)
    staged = staged_rows(conn, "run-1")
    assert staged == 1500 and flushed[-1] % harvester.UNIT > 0  # a byte offset inside the file

    monkeypatch.setattr(harvester.FileDeliveryAdapter, "_flush", real_flush)
    read: list[int] = []
    real_read = harvester.FileReader.read

    def counting(self: Any, storage: Any, path: str, stamp: Any, start: int, digest: Any = None) -> Any:
        read.append(start)
        return real_read(self, storage, path, stamp, start, digest)

    monkeypatch.setattr(harvester.FileReader, "read", counting)
    stats = run.stage_channel(harness.adapter(), conn, "run-1", window, run.CHANGES)
    assert read == [flushed[-1] % harvester.UNIT]  # entered the file at the checkpoint's byte offset
    assert stats.fetched == 5000 and staged_rows(conn, "run-1") == 5000
    applied = run.apply(conn, harness.partner.id, "run-1", window, run.Kept(), None)
    assert applied.upserted == 5000 and harness.held() == museum.published_ids()


def test_a_dump_in_parts_is_harvested_as_slices(tmp_path: Path, conn: psycopg.Connection) -> None:
    folder = tmp_path / "dumps"
    museum = Publisher(fsspec.filesystem("file"), str(folder))
    museum.create(900)
    museum.full(day(0), parts=4, gz=True)
    partner = files_partner(slicing={"threshold_records": 1, "target_records": 1, "max_slices": 3})
    harness = FilesHarness(f"file://{folder}", conn, partner)
    first = harness.run()
    assert len(first.pieces) == 3 and harness.held() == museum.published_ids()
    museum.delete(30, announce=False)
    museum.edit(10)
    museum.full(day(1), parts=4, gz=True)
    second = harness.run()
    assert len(second.pieces) == 3 and second.applied.purged == 30 and harness.held() == museum.published_ids()


def staged_rows(conn: psycopg.Connection, run_id: str) -> int:
    count = int(conn.execute("SELECT count(*) FROM staging WHERE run_id = %s", (run_id,)).fetchone()[0])  # type: ignore[index]
    conn.commit()
    return count


def test_the_reconcile_compares_the_chain_with_what_is_held(tmp_path: Path, conn: psycopg.Connection) -> None:
    from partner_harvest.reconcile import reconcile

    folder = tmp_path / "dumps"
    museum = Publisher(fsspec.filesystem("file"), str(folder))
    museum.create(40)
    museum.full(day(0))
    museum.edit(3)
    museum.delete(2)
    museum.delta(day(1))
    harness = FilesHarness(f"file://{folder}", conn, files_partner(max_purge_fraction=0.5))
    harness.run()
    lost, stray = sorted(museum.published_ids())[:3], "RM-999999"
    conn.execute("DELETE FROM records WHERE partner_id = %s AND identifier = ANY(%s)", (harness.partner.id, lost))
    conn.execute("INSERT INTO records (partner_id, identifier, datestamp, metadata_prefix, metadata, content_hash, run_id,"
                 " observed_at, change_seq) SELECT partner_id, %s, datestamp, metadata_prefix, metadata, content_hash,"
                 " run_id, observed_at, nextval('change_seq') FROM records WHERE partner_id = %s LIMIT 1",
                 (stray, harness.partner.id))
    conn.commit()
    museum.edit(2)
    gone = museum.delete(1)
    museum.delta(day(2))  # published before the reconcile, not yet applied by a harvest
    outcome = reconcile(harness.adapter(), conn, harness.partner, "reconcile-1")
    assert outcome.purged == 1 and outcome.upserted >= 3 and not set(lost) - harness.held()
    harness.run()  # the reconcile's read applied no delivery: the next run still applies day 2's delta
    assert harness.held() == museum.published_ids() and not set(gone) & harness.held()


def test_the_readiness_check_lists_judges_and_samples(tmp_path: Path) -> None:
    from partner_harvest.factory import Endpoint
    from partner_harvest.readiness import FAIL, WARN, CheckSettings, run_check

    folder = tmp_path / "dumps"
    museum = Publisher(fsspec.filesystem("file"), str(folder))
    settings = CheckSettings(delay=0, pause=0, max_requests=20)
    empty = run_check(files_partner(), Endpoint(f"file://{folder}"), settings)
    assert empty.verdict == "not ready" and [f.fault for f in empty.findings if f.status == FAIL] == ["no-deliveries"]
    museum.create(30)
    museum.full(day(0))
    museum.edit(2)
    museum.delta(day(1), marker=False)
    report = run_check(files_partner(), Endpoint(f"file://{folder}"), settings)
    assert report.verdict == "ready", report.text()
    assert [f.fault for f in report.findings if f.status == WARN] == ["delivery-incomplete"]
    assert "30 of the first 30 record(s)" in report.text() or "pass validation" in report.text()


def test_a_file_not_matching_its_published_checksum_waits(tmp_path: Path, conn: psycopg.Connection) -> None:
    """A file copied in halfway while its checksum file lists the whole one: the run waits, as
    for a missing done-marker (no failure), naming the file, its delivery and both digests;
    nothing is applied or kept staged, the cursor stays; the night the partner's file matches,
    it applies. Nights of such waiting show the partner behind, never failing."""
    from partner_harvest.store.health import index_health, partner_health

    folder = tmp_path / "dumps"
    museum = Publisher(fsspec.filesystem("file"), str(folder))
    partner = files_partner(files={"done_marker": None, "checksums": "{date:%Y%m%d}/SHA256SUMS"})
    harness = FilesHarness(f"file://{folder}", conn, partner)
    museum.create(50)
    museum.full(day(0), marker=False, sums=True)
    dump = folder / "20260615" / "full" / "objects-001.csv"
    whole = dump.read_bytes()
    dump.write_bytes(whole[:whole.index(b"\r\n", len(whole) // 2) + 2])  # half of it, still being copied in
    waited = harness.run()
    assert waited.waiting is not None and waited.applied.fetched == 0
    assert waited.waiting.startswith("the full dump of 2026-06-15T00:00:00Z: 20260615/full/objects-001.csv: sha256 "
                                     f"{hashlib.sha256(dump.read_bytes()).hexdigest()} does not match the "
                                     f"published {hashlib.sha256(whole).hexdigest()}"), waited.waiting
    assert waited.waiting.endswith("waiting for the partner to finish the upload")
    assert staged_rows(conn, "run-1") == 0 and harness.held() == set() and harness.cursor is None
    assert harness.audit("run-1")["status"] == "abandoned" and waited.waiting in harness.audit("run-1")["error"]
    museum.full(day(0), marker=False, sums=True)  # the partner publishes the dump again, whole
    assert harness.run().applied.upserted == 50 and harness.held() == museum.published_ids()
    assert harness.cursor == day(0)

    # A delta copied in halfway: the run waits; the partner is not failing, and nights later behind.
    museum.edit(5)
    delta = folder / museum.delta(day(1), marker=False, sums=True)
    whole = delta.read_bytes()
    delta.write_bytes(whole[:whole.index(b"\r\n", len(whole) // 2) + 2])
    held_before = titles(conn, harness)
    waiting = harness.run()
    assert waiting.waiting is not None and "the delta of 2026-06-16T00:00:00Z: 20260616/delta/changes.csv: sha256 " in waiting.waiting
    assert titles(conn, harness) == held_before and harness.cursor == day(0)
    now = datetime.now(timezone.utc)
    for health in (partner_health(conn, [partner], now), index_health(conn, [partner], now)):
        assert health[0].state == "ok" and waiting.waiting in (health[0].cause or ""), health[0]
    later = now + timedelta(days=3)  # three nights of the same wait
    assert [h.state for h in (*partner_health(conn, [partner], later), *index_health(conn, [partner], later))] == [
        "behind", "behind"]
    delta.write_bytes(whole)  # the upload finished
    applied = harness.run()
    assert applied.waiting is None and applied.applied.upserted == 5 and harness.cursor == day(1)
    assert titles(conn, harness) == {i: r["title"] for i, r in museum.published.items()}
