"""Suppressed Sierra bibs (options.sierra.suppressed) and bibs listed without MARC.

The default, ``purge``, holds the public bibs only: full loads (the export path too), the
change poll, the deletion poll and the reconcile agree on it; ``flag`` holds them marked.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import psycopg
import pytest

from include.simulators.sierra import SierraSimulator, SimulatedCatalogue
from partner_harvest.reconcile import reconcile
from tests.support.harness import SIERRA_KEY as KEY
from tests.support.harness import SIERRA_SECRET as SECRET
from tests.support.harness import SierraHarness as Harness
from tests.support.partners import FAST_SIERRA, sierra_partner

if TYPE_CHECKING:
    from partner_harvest.registry import Partner


def partner(suppressed: str | None = None, id: str = "library", **fields: Any) -> Partner:
    """A test Sierra partner with the registry's default for suppressed bibs, or ``suppressed``."""
    options = {k: v for k, v in FAST_SIERRA.items() if k != "suppressed"}
    if suppressed is not None:
        options["suppressed"] = suppressed
    return sierra_partner(id, options={"sierra": options}, **fields)


def suppressed(catalogue: SimulatedCatalogue) -> set[str]:
    return {b.id for b in catalogue.bibs(int(i) for i in catalogue.sorted_live_ids()) if b.suppressed}


def flagged(conn: psycopg.Connection, partner_id: str = "library") -> set[str]:
    rows = conn.execute("SELECT identifier FROM records WHERE partner_id = %s AND warnings ? 'sierra.suppressed'",
                        (partner_id,)).fetchall()
    conn.commit()
    return {r[0] for r in rows}


@pytest.mark.parametrize("omits", [False, True], ids=["whole-export-lists-suppressed", "sliced-export-omits-them"])
def test_purge_holds_the_public_bibs_over_a_full_load_and_two_nights(conn: psycopg.Connection, omits: bool) -> None:
    catalogue = SimulatedCatalogue(bibs=600, deleted_fraction=0.04, suppressed_fraction=0.05, seed=51)
    slicing = {"threshold_records": 200, "target_records": 200, "max_slices": 3} if omits else {"max_slices": 1}
    with SierraSimulator(catalogue, client_key=KEY, client_secret=SECRET, export_omits_suppressed=omits) as sim:
        harness = Harness(sim, conn, partner(slicing=slicing))
        assert harness.partner.options.sierra.suppressed == "purge"  # the registry's default
        result = harness.run_through()
        hidden = suppressed(catalogue)
        assert result.window.is_full and hidden and harness.held() == catalogue.public_ids()
        assert len(result.pieces) == (3 if omits else 1)
        checks = conn.execute("SELECT sum(check_expected), sum(check_found), bool_and(check_ok) FROM harvest_runs "
                              "WHERE check_kind = 'sierra-id-enumeration'").fetchone()
        assert checks == (len(catalogue.public_ids()),) * 2 + (True,)  # the witness counts public bibs
        for night in (1, 2):
            catalogue.advance_clock(3600)
            public = sorted(catalogue.public_ids())
            shown_again = catalogue.suppress(sorted(suppressed(catalogue))[:4], on=False)  # staff unsuppress some
            now_hidden = catalogue.suppress(public[night::40])  # and suppress others
            catalogue.edit(5)
            catalogue.delete_ids(public[night + 1::90])
            catalogue.add(3)
            stripped = catalogue.strip_marc(public[night + 2::150])  # deleted, still listed without MARC
            harness.run()
            assert harness.held() == catalogue.public_ids(), night
            assert not set(now_hidden) & harness.held() and set(shown_again) <= harness.held()
            assert not set(stripped) & harness.held()
        reasons: dict[str, int] = dict(conn.execute("SELECT reason, count(*) FROM deletions GROUP BY reason").fetchall())
        assert reasons["suppressed"] >= 20 and reasons["no_marc"] >= 2 and reasons["tombstone"] >= 2, reasons
        # the reconcile agrees: nothing to do
        outcome = reconcile(harness.adapter(), conn, harness.partner, "reconcile-1")
        assert outcome.purged == 0 and outcome.upserted == 0 and harness.held() == catalogue.public_ids()


def test_flag_holds_suppressed_bibs_marked_and_keep_holds_them_plain(conn: psycopg.Connection) -> None:
    catalogue = SimulatedCatalogue(bibs=300, deleted_fraction=0.0, suppressed_fraction=0.05, seed=52)
    with SierraSimulator(catalogue, client_key=KEY, client_secret=SECRET) as sim:
        harness = Harness(sim, conn, partner("flag"))
        harness.run()
        assert harness.held() == catalogue.live_ids() and flagged(conn) == suppressed(catalogue)
        catalogue.advance_clock(3600)
        catalogue.suppress(sorted(suppressed(catalogue))[:2], on=False)
        catalogue.suppress(sorted(catalogue.public_ids())[:3])
        harness.run()
        assert harness.held() == catalogue.live_ids() and flagged(conn) == suppressed(catalogue)
        # a partner that switches to purge: the reconcile removes what is no longer to be held
        purging = partner(max_purge_fraction=0.5)
        outcome = reconcile(harness.adapter().__class__(purging, harness.adapter().client), conn, purging, "r-1")
        assert outcome.purged == len(suppressed(catalogue)) and harness.held() == catalogue.public_ids()
    catalogue = SimulatedCatalogue(bibs=200, deleted_fraction=0.0, suppressed_fraction=0.05, seed=53)
    with SierraSimulator(catalogue, client_key=KEY, client_secret=SECRET) as sim:
        harness = Harness(sim, conn, partner("keep", "keeper"))
        harness.run()
        assert harness.held() == catalogue.live_ids() and suppressed(catalogue) and not flagged(conn, "keeper")


def test_a_held_bib_listed_without_marc_is_not_kept_stale(conn: psycopg.Connection) -> None:
    """Regression: a bib the change poll listed without the MARC it asked for was quarantined,
    and the version held before stayed live."""
    catalogue = SimulatedCatalogue(bibs=120, deleted_fraction=0.0, suppressed_fraction=0.0, seed=54)
    with SierraSimulator(catalogue, client_key=KEY, client_secret=SECRET) as sim:
        harness = Harness(sim, conn, sierra_partner())
        harness.run()
        catalogue.advance_clock(3600)
        stripped = catalogue.strip_marc(sorted(catalogue.live_ids())[:2])
        harness.run()
        assert not set(stripped) & harness.held() and harness.held() == catalogue.public_ids()
