"""Sierra items and holdings (options.sierra.channels): their own polls, tables and feed events.

A catalogue with items and holdings is loaded, then nights of checkouts, transfers between
bibs, deletions and suppressions follow: after every night the tables hold exactly the
simulator's public live sets (with the bibs each belongs to), and the change feed holds one
``attachment_events`` row for each bib whose items or holdings changed, no other.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg
import pytest

from include.simulators.sierra import SierraSimulator, SimulatedCatalogue
from partner_harvest.feed import export_jsonl
from partner_harvest.reconcile import reconcile
from tests.support.checks import present
from tests.support.harness import SIERRA_KEY as KEY
from tests.support.harness import SIERRA_SECRET as SECRET
from tests.support.harness import SierraHarness as Harness
from tests.support.partners import FAST_SIERRA, sierra_partner

if TYPE_CHECKING:
    from collections.abc import Iterable

    from partner_harvest.registry import Partner

CHANNELS = ["bibs", "items", "holdings"]


def partner(channels: list[str] = CHANNELS, suppressed: str = "purge", **fields: Any) -> Partner:
    return sierra_partner("library", options={"sierra": {**FAST_SIERRA, "suppressed": suppressed,
                                                          "channels": channels}}, **fields)


def held(conn: psycopg.Connection, table: str) -> dict[str, tuple[str, ...]]:
    rows = conn.execute(f"SELECT identifier, bib_ids FROM {table} WHERE partner_id = 'library'").fetchall()
    conn.commit()
    return {i: tuple(sorted(b)) for i, b in rows}


def events_of(conn: psycopg.Connection, result: int) -> list[str]:
    """The bibs named in the change feed's attachment events of run ``run-<result>``."""
    after, until = present(conn.execute("SELECT change_seq_after, change_seq_until FROM harvest_runs WHERE partner_id = "
                                "'library' AND run_id = %s AND channel = 'changes'",
                                (f"run-{result}",)).fetchone())
    rows = conn.execute("SELECT identifier FROM attachment_events WHERE partner_id = 'library' AND change_seq > %s "
                        "AND change_seq <= %s", (after, until)).fetchall()
    conn.commit()
    return sorted(r[0] for r in rows)


def touched(before: dict[str, tuple[str, ...]], after: dict[str, tuple[str, ...]], ids: Iterable[str]) -> set[str]:
    """The bibs whose public items changed: each changed item's bibs before and after."""
    return {b for i in ids for b in (*before.get(i, ()), *after.get(i, ()))}


def test_items_and_holdings_equal_the_live_sets_after_a_load_and_nights_and_the_feed_names_their_bibs(
        conn: psycopg.Connection, tmp_path: Path) -> None:
    catalogue = SimulatedCatalogue(bibs=300, deleted_fraction=0.02, suppressed_fraction=0.02, seed=61)
    items = catalogue.attach("items", 750)
    holdings = catalogue.attach("holdings", 120)
    with SierraSimulator(catalogue, client_key=KEY, client_secret=SECRET, mixed_fixed_types=True) as sim:
        harness = Harness(sim, conn, partner(slicing={"threshold_records": 200, "target_records": 200,
                                                      "max_slices": 4}))
        first = harness.run_through()
        assert first.window.is_full and set(first.staged) >= {"items", "holdings", "item_deletions"}
        assert harness.held() == catalogue.public_ids()
        assert held(conn, "items") == items.live(public_only=True)
        assert held(conn, "holdings") == holdings.live(public_only=True)
        assert harness.cursors["items"] == harness.cursors["changes"]  # each channel's own cursor, moved
        bib_ids = {r[0] for r in conn.execute("SELECT DISTINCT identifier FROM items").fetchall()}
        assert bib_ids & catalogue.live_ids(), "item and bib numbers overlap, as in Sierra: tables keep them apart"
        for night in range(1, 4):
            catalogue.advance_clock(86400)
            before_items, before_holdings = items.live(public_only=True), holdings.live(public_only=True)
            changed = items.checkout(12)
            changed += list(items.transfer(5))
            changed += items.delete(4)
            changed += items.suppress(3)
            changed += items.suppress(ids=sorted(set(items.live()) - set(before_items))[:1], on=False)
            changed += items.add(2)
            changed_holdings = holdings.checkout(3) + holdings.delete(1) + list(holdings.transfer(1))
            catalogue.edit(4)
            window, _, _, applied = harness.run()
            assert not window.is_full, night
            assert harness.held() == catalogue.public_ids(), night
            after_items, after_holdings = items.live(public_only=True), holdings.live(public_only=True)
            assert held(conn, "items") == after_items, night
            assert held(conn, "holdings") == after_holdings, night
            expected = (touched(before_items, after_items, changed)
                        | touched(before_holdings, after_holdings, changed_holdings))
            assert events_of(conn, harness.runs) == sorted(expected), night  # one per bib, no other
        reasons: dict[str, int] = dict(conn.execute("SELECT reason, count(*) FROM attached_deletions GROUP BY reason").fetchall())
        conn.commit()
        assert reasons.get("tombstone", 0) >= 12 and reasons.get("suppressed", 0) >= 9, reasons
        # the JSON Lines export: the events and the item-level changes, apart from the records
        exported = export_jsonl(conn, "test", "library", tmp_path)
        assert exported is not None and exported.attached > 0
        ops = [json.loads(line)["op"] for line in open(exported.path, encoding="utf-8")]
        assert {"upsert", "attachments", "attached_upsert", "attached_delete"} <= set(ops)
        # a quiet night: nothing moves, nothing is reported
        catalogue.advance_clock(86400 * 3)
        harness.run()
        assert events_of(conn, harness.runs) == []


@pytest.mark.parametrize("policy", ["flag", "keep"])
def test_suppressed_items_follow_the_policy(conn: psycopg.Connection, policy: str) -> None:
    catalogue = SimulatedCatalogue(bibs=60, deleted_fraction=0.0, suppressed_fraction=0.0, seed=62)
    items = catalogue.attach("items", 150, suppressed_fraction=0.05)
    with SierraSimulator(catalogue, client_key=KEY, client_secret=SECRET) as sim:
        harness = Harness(sim, conn, partner(["bibs", "items"], policy))
        harness.run()
        assert held(conn, "items") == items.live()
        flagged = {r[0] for r in conn.execute("SELECT identifier FROM items WHERE warnings ? 'sierra.suppressed'")}
        conn.commit()
        hidden = set(items.live()) - set(items.live(public_only=True))
        assert hidden and flagged == (hidden if policy == "flag" else set())


def test_a_partner_without_items_has_no_item_channels_and_a_reconcile_covers_items(conn: psycopg.Connection) -> None:
    catalogue = SimulatedCatalogue(bibs=80, deleted_fraction=0.0, suppressed_fraction=0.0, seed=63)
    items = catalogue.attach("items", 200, deleted_fraction=0.0, suppressed_fraction=0.0)
    with SierraSimulator(catalogue, client_key=KEY, client_secret=SECRET) as sim:
        bibs_only = Harness(sim, conn, partner(["bibs"]))
        result = bibs_only.run_through()
        assert set(result.staged) == {"changes", "deletions"} and not held(conn, "items")
        harness = Harness(sim, conn, partner(["bibs", "items"]))
        harness.cursors = dict(bibs_only.cursors)
        harness.runs = bibs_only.runs
        harness.run()  # items added later: their first run lists them all
        assert held(conn, "items") == items.live()
        # items deleted upstream without a trace (purged from Sierra): the reconcile removes them
        gone = sorted(items.live())[:3]
        conn.execute("UPDATE items SET datestamp = datestamp - interval '1 day' WHERE identifier = ANY(%s)", (gone,))
        items.delete(ids=gone)
        conn.execute("INSERT INTO items (partner_id, identifier, bib_ids, datestamp, content, content_hash, run_id, "
                     "observed_at) VALUES ('library', '9999999', '{1000001}', now(), '{}', 'x', 'r', now())")
        conn.commit()
        outcome = reconcile(harness.adapter(), conn, harness.partner, "reconcile-1")
        assert held(conn, "items") == items.live(), outcome


def test_a_quiet_night_looks_once_per_poll_and_applies_every_channel_and_the_gate_weighs_items(conn: psycopg.Connection) -> None:
    from partner_harvest import gates
    from partner_harvest.run import Kept, freeze, quiet_night, stage
    from partner_harvest.store.health import channel_rows

    catalogue = SimulatedCatalogue(bibs=100, deleted_fraction=0.0, suppressed_fraction=0.0, seed=64)
    items = catalogue.attach("items", 250, deleted_fraction=0.0, suppressed_fraction=0.0)
    catalogue.attach("holdings", 30, deleted_fraction=0.0, suppressed_fraction=0.0)
    with SierraSimulator(catalogue, client_key=KEY, client_secret=SECRET) as sim:
        harness = Harness(sim, conn, partner(max_shrink_fraction=0.1))
        harness.run()
        catalogue.advance_clock(86400 * 3)
        harness.run()  # past the deletion polls' overlap
        catalogue.advance_clock(86400)  # a night later, nothing changed
        before = len(sim.requests)
        adapter = harness.adapter()
        outlets = Kept(dict(harness.cursors))
        window = freeze(harness.partner, adapter, conn, outlets)
        finished = quiet_night(adapter, conn, "quiet-1", window, outlets)
        polls = [r for r in sim.requests[before:] if r["path"].rsplit("/", 1)[-1] in ("bibs", "items", "holdings")]
        assert finished is not None and len(polls) == 6  # bibs, items, holdings: a change and a deletion poll each
        assert set(finished.moved) == {"changes", "deletions", "items", "item_deletions", "holdings",
                                        "holding_deletions"} and all(m["moved"] for m in finished.moved.values())
        rows = {row.channel: row for row in channel_rows(conn, harness.partner)}
        assert rows["items"].held == len(items.live()) and rows["items"].table == "items"
        assert rows["item_deletions"].cursor is not None and rows["changes"].held == len(catalogue.public_ids())
        # a night deleting half the items: the approval gate weighs them against the items held
        catalogue.advance_clock(3600)
        items.delete(len(items.live()) // 2)
        adapter = harness.adapter()
        window = freeze(harness.partner, adapter, conn, Kept(dict(outlets.cursors)))
        assert not adapter.window_is_empty(window)
        stage(harness.partner, adapter, conn, "gated-1", window)
        shrink = gates.harvest_shrink(conn, harness.partner, "gated-1", window, tombstones=1)
        assert shrink is not None and shrink.held == 250 and shrink.removals == 125
        assert shrink.sample[0]["why"].startswith("items: ")
