"""Item and holdings bodies recorded from real Sierra servers, replayed through the channels.

The expected outcomes come from the API's documentation and the recordings, not from our
code: an item or holdings record is identified by its ``id`` and belongs to the bibs its
``bibIds`` names (JSON strings on one server, numbers on another: the same ids); its
version is its ``updatedDate``; a ``deleted: true`` entry with a ``deletedDate`` (a date) is
a deletion on that day, also inside a change window, with no bibs left; 404 code 107 is "no
results"; a body that is not JSON cannot be read and fails its poll, naming the request,
with nothing applied. The corpus: tests/fixtures/realworld/sierra/SOURCES.md.
"""

from __future__ import annotations

import json
from datetime import date, datetime, time, timezone

import psycopg

from partner_harvest import pipeline
from partner_harvest.errors import HarvestError
from partner_harvest.factory import Endpoint, build_adapter
from partner_harvest.run import run_partner
from tests.integration.sierra_replay import Replay, ReplayServer, recorded, wiremock_body
from tests.support.harness import SIERRA_KEY as KEY
from tests.support.harness import SIERRA_SECRET as SECRET
from tests.support.partners import sierra_partner

SINCE = datetime(2025, 11, 1, tzinfo=timezone.utc)
LONG_AGO = datetime(2000, 1, 1, tzinfo=timezone.utc)
ITEMS = "wellcome/mappings/items-a7f2facd-903a-4ed9-bab8-2be7b3ee0529.json"


def stamp(text: str) -> datetime:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)


def poll(conn: psycopg.Connection, replay: Replay, channels: list[str]) -> str | None:
    """One incremental run of a partner with ``channels`` against the replay, every cursor set."""
    p = sierra_partner("library", page_size=50, options={"sierra": {"suppressed": "purge", "channels": channels,
                                                                     "server_error_backoff": 0.01}})
    with ReplayServer(replay) as server:
        adapter = build_adapter(p, Endpoint(server.base_url, KEY, SECRET))
        cursors: dict[str, datetime | None] = {name: LONG_AGO if name in ("items", "holdings") else SINCE
                   for name in ("deletions", "items", "item_deletions", "holdings", "holding_deletions")}
        window = pipeline.freeze_window(adapter, p.lag, SINCE, pipeline.RunRequest("incremental"), cursors)
        try:
            run_partner(p, adapter, conn, "run-1", window=window)
        except HarvestError as exc:
            conn.rollback()
            return str(exc)
    return None


def rows(conn: psycopg.Connection, table: str) -> dict[str, tuple[tuple[str, ...], datetime]]:
    found = conn.execute(f"SELECT identifier, bib_ids, datestamp FROM {table}").fetchall()
    conn.commit()
    return {i: (tuple(b), d) for i, b, d in found}


def test_a_production_items_window_lands_its_items_and_its_deleted_stubs_purge_on_their_day(conn: psycopg.Connection) -> None:
    status, body = wiremock_body(ITEMS)
    entries = json.loads(body)["entries"]
    live = [e for e in entries if not e.get("deleted")]
    stubs = [e for e in entries if e.get("deleted")]
    assert (status, len(live), len(stubs)) == (200, 40, 10)
    # the stubs' items were held before (an older version): the window deletes them
    for e in stubs:
        conn.execute("INSERT INTO items (partner_id, identifier, bib_ids, datestamp, content, content_hash, run_id, "
                     "observed_at) VALUES ('library', %s, '{1}', %s, '{}', 'h', 'r0', now())", (e["id"], LONG_AGO))
    conn.commit()
    error = poll(conn, Replay(attached={"items": {0: (status, body)}}), ["bibs", "items"])
    assert error is None
    expected = {e["id"]: (tuple(e["bibIds"]), stamp(e["updatedDate"])) for e in live}
    assert rows(conn, "items") == expected
    purged: dict[str, datetime] = dict(conn.execute("SELECT identifier, upstream_datestamp FROM attached_deletions").fetchall())
    conn.commit()
    assert purged == {e["id"]: datetime.combine(date.fromisoformat(e["deletedDate"]), time(23, 59, 59, 999999),
                                                tzinfo=timezone.utc) for e in stubs}
    bibs = {b for e in live for b in e["bibIds"]} | {"1"}
    events = {r[0] for r in conn.execute("SELECT identifier FROM attachment_events").fetchall()}
    assert events == bibs  # each bib whose items changed: the 40 items' bibs and the stubs' former one


def test_production_holdings_with_numeric_ids_land_by_keyset_and_end_on_a_short_page(conn: psycopg.Connection) -> None:
    pages = {0: wiremock_body("wellcome/mappings/holdings-2003-page1.json"),
             1064036: wiremock_body("wellcome/mappings/holdings-2003-page2.json"),
             1064037: wiremock_body("wellcome/mappings/holdings-2003-page3.json")}
    replay = Replay(attached={"holdings": pages})
    assert poll(conn, replay, ["bibs", "holdings"]) is None
    first, second = (json.loads(pages[key][1])["entries"] for key in (0, 1064036))
    assert isinstance(first[0]["id"], int) and isinstance(first[0]["bibIds"][0], int)  # JSON numbers, recorded
    assert rows(conn, "holdings") == {str(e["id"]): (tuple(str(b) for b in e["bibIds"]), stamp(e["updatedDate"]))
                                      for e in first + second}
    asked = [q.get("id") for _, path, q in replay.requests if path.endswith("/holdings") and q.get("deleted") == "false"]
    assert asked == ["[0,]", f"[{first[-1]['id'] + 1},]"]  # keyset after the last id; the short page ends it


def test_an_item_with_eight_digit_ids_lands_and_a_body_that_is_not_json_fails_its_poll(conn: psycopg.Connection) -> None:
    item = json.loads(recorded("bookops/item-get-response-sample.json"))
    # built: the single-item answer as a one-entry list page (the recording is of GET items/{id})
    page = json.dumps({"total": 1, "start": 0, "entries": [item]}).encode()
    assert poll(conn, Replay(attached={"items": {0: (200, page)}}), ["bibs", "items"]) is None
    assert rows(conn, "items") == {"38999500": (("21759599",), stamp("2024-02-26T14:41:51Z"))}
    # a sandbox's items list whose fixedFields keys are bare numbers: not JSON
    error = poll(conn, Replay(attached={"items": {0: (200, recorded("dcb-sandbox/sierra-api-three-items.json"))}}),
                 ["bibs", "items"])
    assert error is not None and "expected JSON" in error and "/items?" in error
    assert rows(conn, "items") == {"38999500": (("21759599",), stamp("2024-02-26T14:41:51Z"))}  # nothing applied
