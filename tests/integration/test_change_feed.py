"""The change feed against real PostgreSQL: sequence, high water, concurrent applies, export."""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path

import psycopg
import pytest

from partner_harvest.feed import export_jsonl, write_range
from partner_harvest.records import HarvestItem, Record, Tombstone
from partner_harvest.store import apply_run, connect, feed
from partner_harvest.store.db import one, scalar
from tests.support.checks import present
from tests.support.records import rec as support_rec
from tests.support.records import stage as stage_for
from tests.support.records import window

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)  # as tests/integration/test_store_apply.py
WINDOW = window(T0 + timedelta(days=10))


def rec(ident: str, at: datetime, title: str = "t") -> Record:
    return support_rec(ident, at, title, ("s",))


def stage(conn: psycopg.Connection, partner: str, run_id: str, items: Sequence[HarvestItem],
          channel: str = "changes") -> None:
    stage_for(conn, partner, run_id, items, channel, WINDOW)

CONSUMER = "test-consumer"


def run_range(conn: psycopg.Connection, partner: str, run_id: str) -> tuple[int, int]:
    after, until = one(conn.execute(
        "SELECT change_seq_after, change_seq_until FROM harvest_runs WHERE partner_id = %s AND run_id = %s",
        (partner, run_id),
    ))
    conn.commit()
    return after, until


def read(conn: psycopg.Connection, partner: str, after: int, until: int) -> list[tuple[str, str]]:
    return [(c["op"], c["identifier"]) for c in feed.changes(conn, partner, after, until)]


def lines(path: str) -> list[dict]:
    return [json.loads(text) for text in Path(path).read_text(encoding="utf-8").splitlines()]


def test_runs_produce_exactly_their_changes_in_sequence_order(conn: psycopg.Connection) -> None:
    stage(conn, "p", "r1", [rec("a", T0), rec("b", T0), rec("c", T0)])
    apply_run(conn, "p", "r1")
    after1, until1 = run_range(conn, "p", "r1")
    assert after1 == 0 and until1 > 0
    assert sorted(read(conn, "p", after1, until1)) == [("upsert", "a"), ("upsert", "b"), ("upsert", "c")]

    later = T0 + timedelta(hours=1)
    stage(conn, "p", "r2", [rec("a", later, "edited"), Tombstone("b", later), rec("c", T0)])
    apply_run(conn, "p", "r2")
    after2, until2 = run_range(conn, "p", "r2")
    assert after2 == until1 and until2 > until1
    assert read(conn, "p", after2, until2) == [("upsert", "a"), ("delete", "b")]  # c unchanged: no change
    # Current state: what r1 changed and r2 superseded is no longer in r1's range.
    assert read(conn, "p", after1, until1) == [("upsert", "c")]
    assert feed.high_water(conn, "p") == until2
    conn.commit()

    stage(conn, "p", "r3", [rec("c", T0)])  # nothing changes: an empty range
    apply_run(conn, "p", "r3")
    assert run_range(conn, "p", "r3") == (until2, until2)
    assert feed.run_changes(conn, "p", "r3").as_extra()["changed"] is False
    conn.commit()


def test_delete_then_re_add_reads_deletion_first(conn: psycopg.Connection) -> None:
    stage(conn, "p", "r1", [rec("a", T0)])
    apply_run(conn, "p", "r1")
    stage(conn, "p", "r2", [Tombstone("a", T0 + timedelta(hours=1))])
    apply_run(conn, "p", "r2")
    stage(conn, "p", "r3", [rec("a", T0 + timedelta(hours=2), "back")])
    apply_run(conn, "p", "r3")
    assert read(conn, "p", 0, feed.high_water(conn, "p")) == [("delete", "a"), ("upsert", "a")]
    conn.commit()


def test_partners_have_separate_high_waters(conn: psycopg.Connection) -> None:
    stage(conn, "p", "r1", [rec("a", T0)])
    apply_run(conn, "p", "r1")
    stage(conn, "q", "r1", [rec("z", T0)])
    apply_run(conn, "q", "r1")
    assert read(conn, "p", 0, feed.high_water(conn, "q")) == [("upsert", "a")]
    assert read(conn, "q", 0, feed.high_water(conn, "q")) == [("upsert", "z")]
    conn.commit()


def _wait_until_blocked(observer: psycopg.Connection, backend_pid: int) -> None:
    """Wait (bounded) until the backend waits for a lock: a condition, not a sleep."""
    for _ in range(600):
        waiting = observer.execute(
            "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s", (backend_pid,)
        ).fetchone()
        observer.commit()
        if waiting and waiting[0]:
            return
        observer.execute("SELECT pg_sleep(0.05)")
        observer.commit()
    raise AssertionError(f"backend {backend_pid} never blocked")


def test_an_apply_committing_while_the_reader_reads_is_neither_missed_nor_repeated(
    db: str, conn: psycopg.Connection, tmp_path: Path,
) -> None:
    stage(conn, "p", "r1", [rec(f"id{i:03d}", T0) for i in range(50)])
    apply_run(conn, "p", "r1")
    later = T0 + timedelta(hours=1)
    stage(conn, "p", "r2", [rec(f"id{i:03d}", later, "edited") for i in range(10)]
          + [Tombstone(f"id{i:03d}", later) for i in range(10, 15)]
          + [rec(f"new{i}", later) for i in range(5)])
    stage(conn, "q", "rq", [rec("z", later)])

    # Hold r2's apply inside its transaction after it has taken its change_seq values.
    blocker = connect(db)
    blocker.execute("SELECT 1 FROM harvest_runs WHERE partner_id = 'p' AND run_id = 'r2' FOR UPDATE")
    applier = connect(db)
    failures: list[BaseException] = []

    def apply_r2() -> None:
        try:
            apply_run(applier, "p", "r2")
        except BaseException as exc:  # reported by the test thread
            failures.append(exc)

    thread = threading.Thread(target=apply_r2)
    thread.start()
    observer = connect(db)
    try:
        _wait_until_blocked(observer, applier.info.backend_pid)
        # Another partner commits meanwhile, with greater values than r2's in-flight ones:
        # a reader remembering "the greatest change_seq seen" would now skip r2's changes.
        apply_run(observer, "q", "rq")
        q_until = feed.high_water(observer, "q")
        observer.commit()

        reader = connect(db)
        first = feed.begin_export(reader, CONSUMER, "p")
        assert first is not None and first.after == 0
        stream = feed.changes(reader, "p", first.after, first.until)
        head = next(stream)
        blocker.commit()  # r2 commits while the reader is in the middle of its range
        thread.join(timeout=30)
        assert not thread.is_alive() and not failures, failures
        seen_first = [head, *stream]
        feed.finish_export(reader, first)
        assert len(seen_first) == 50 and {c["op"] for c in seen_first} == {"upsert"}

        r2_after, r2_until = run_range(observer, "p", "r2")
        assert r2_after == first.until
        in_flight = scalar(observer.execute(
            "SELECT min(change_seq) FROM records WHERE partner_id = 'p' AND run_id = 'r2'"))
        assert in_flight < q_until, "the scenario must have r2's values below q's committed ones"
        observer.commit()

        second = present(feed.begin_export(reader, CONSUMER, "p"))
        assert (second.after, second.until) == (r2_after, r2_until)
        seen_second = list(feed.changes(reader, "p", second.after, second.until))
        feed.finish_export(reader, second)
        assert sorted((c["op"], c["identifier"]) for c in seen_second) == sorted(
            [("upsert", f"id{i:03d}") for i in range(10)] + [("delete", f"id{i:03d}") for i in range(10, 15)]
            + [("upsert", f"new{i}") for i in range(5)])
        assert feed.begin_export(reader, CONSUMER, "p") is None
        reader.close()
    finally:
        blocker.close()
        thread.join(timeout=30)
        applier.close()
        observer.close()


def test_a_crash_between_file_and_position_rewrites_the_same_range(
    db: str, conn: psycopg.Connection, tmp_path: Path,
) -> None:
    stage(conn, "p", "r1", [rec("a", T0), rec("b", T0)])
    apply_run(conn, "p", "r1")
    span = present(feed.begin_export(conn, CONSUMER, "p"))
    crashed = present(write_range(conn, span, tmp_path))  # ... and the task dies before finish_export
    assert feed.position(conn, CONSUMER, "p") == 0
    conn.commit()

    later = T0 + timedelta(hours=1)
    stage(conn, "p", "r2", [rec("a", later, "edited"), rec("c", later)])
    apply_run(conn, "p", "r2")
    rerun = present(export_jsonl(conn, CONSUMER, "p", tmp_path))
    assert rerun.resumed and rerun.path == crashed.path and (rerun.after, rerun.until) == (span.after, span.until)
    nxt = present(export_jsonl(conn, CONSUMER, "p", tmp_path))
    assert nxt.after == span.until and not nxt.resumed
    assert export_jsonl(conn, CONSUMER, "p", tmp_path) is None

    files = sorted((tmp_path / "p").glob("changes_*.jsonl"))
    assert [str(f) for f in files] == [rerun.path, nxt.path]
    assert not list((tmp_path / "p").glob(".*"))  # no temp file left
    exported = [line for f in files for line in lines(str(f))]
    seqs = [line["seq"] for line in exported]
    assert seqs == sorted(seqs) and len(seqs) == len(set(seqs))
    state: dict[str, str] = {}
    for line in exported:  # applying the files in order gives the current state
        if line["op"] == "upsert":
            state[line["identifier"]] = line["title"]
        else:
            state.pop(line["identifier"], None)
    assert state == {"a": "edited", "b": "t", "c": "t"}
    assert {(line["op"], line["identifier"]) for line in lines(nxt.path)} == {("upsert", "a"), ("upsert", "c")}


def test_a_concurrent_export_of_the_same_consumer_cannot_move_the_position_twice(conn: psycopg.Connection) -> None:
    stage(conn, "p", "r1", [rec("a", T0)])
    apply_run(conn, "p", "r1")
    span = present(feed.begin_export(conn, CONSUMER, "p"))
    feed.finish_export(conn, span)
    with pytest.raises(feed.FeedPositionLost, match="another export"):
        feed.finish_export(conn, span)


def test_positions_refuse_a_connection_inside_a_transaction(conn: psycopg.Connection) -> None:
    conn.execute("SELECT 1")
    with pytest.raises(ValueError, match="outside any transaction"):
        feed.begin_export(conn, CONSUMER, "p")
    conn.rollback()


def test_the_migration_numbers_rows_written_before_the_feed(db: str) -> None:
    from partner_harvest.store.schema import ensure_schema, migration_files

    with connect(db) as old:
        for name, text in migration_files():
            if name < "0007":
                old.execute(text)
        old.execute("INSERT INTO records (partner_id, identifier, datestamp, metadata_prefix, metadata, content_hash,"
                    " run_id) VALUES ('p', 'a', now(), 'oai_dc', '<x/>', 'h', 'r0')")
        old.execute("INSERT INTO deletions (partner_id, identifier, run_id) VALUES ('p', 'b', 'r0')")
        old.execute(dict(migration_files())["0007_change_feed.sql"])
        old.commit()
        ensure_schema(old)  # the later migrations too (the feed reads their tables)
        hw = feed.high_water(old, "p")
        old.commit()
        assert read(old, "p", 0, hw) == [("upsert", "a"), ("delete", "b")]


def test_forget_writes_every_record_to_the_feed_as_a_deletion_and_a_reload_follows(conn: psycopg.Connection) -> None:
    """A consumer that read the partner, then reads on after `forget` and a reload, ends with
    exactly the reloaded set: what the reload lacks is deleted downstream too."""
    from partner_harvest.store.admin import FEED_DELETIONS, forget_partner

    stage(conn, "p", "r1", [rec("a", T0), rec("b", T0), rec("c", T0)])
    apply_run(conn, "p", "r1")
    stage(conn, "q", "r1", [rec("x", T0)])
    apply_run(conn, "q", "r1")
    consumer: dict[str, dict] = {}

    def catch_up(after: int) -> int:
        until = feed.high_water(conn, "p")
        for change in feed.changes(conn, "p", after, until):
            if change["op"] == "upsert":
                consumer[change["identifier"]] = change
            else:
                consumer.pop(change["identifier"], None)
        return until

    seen = catch_up(0)
    assert sorted(consumer) == ["a", "b", "c"]
    q_water = feed.high_water(conn, "q")
    removed = forget_partner(conn, "p")
    assert removed["records"] == 3 and removed[FEED_DELETIONS] == 3
    assert feed.high_water(conn, "p") > seen and feed.high_water(conn, "q") == q_water  # q untouched
    reasons = conn.execute("SELECT DISTINCT reason FROM deletions WHERE partner_id = 'p' AND change_seq > %s",
                           (seen,)).fetchall()
    conn.commit()
    assert reasons == [("forgotten",)]
    seen = catch_up(seen)
    assert consumer == {}
    stage(conn, "p", "r2", [rec("b", T0), rec("d", T0)])  # the reload: a and c are gone at the partner
    apply_run(conn, "p", "r2")
    catch_up(seen)
    assert sorted(consumer) == ["b", "d"]
    assert forget_partner(conn, "gone")[FEED_DELETIONS] == 0 and feed.high_water(conn, "gone") == 0
    conn.commit()
