"""What the soak found, each reproduced small (without Airflow, on the pipeline the tasks call).

A partner clock that jumps back past our cursor (seed 5, ``clock_backwards`` with the
clock set back 26 hours, see CHANGELOG.md and docs/design/soak.md): the run that meets it alerts
and skips nothing, but every record the partner changes while its clock is still behind
our cursor is stamped before the cursor, and no later incremental window reached back
there: edits stayed stale for good, deletions until the weekly reconcile. Fixed: the run
that sees the clock behind our cursor harvests the whole list up to the partner's clock
(pipeline.freeze_window), every window remembers the partner's clock
(harvest_runs.partner_clock), and the next one starts from what the partner's timeline
really covered (pipeline.resume_point); the cursor itself never moves backwards (I1).
"""

from __future__ import annotations

from datetime import timedelta

import psycopg

from include.simulators.oai_pmh import OaiSimulator, SimulatedRepository, title
from include.simulators.sierra import SierraSimulator, SimulatedCatalogue
from tests.support.harness import SIERRA_KEY, SIERRA_SECRET, SierraHarness
from tests.support.harness import OaiHarness as Harness
from tests.support.partners import oai_partner, sierra_partner


def test_edits_made_while_the_partner_clock_is_behind_the_cursor_reach_the_mirror(conn: psycopg.Connection) -> None:
    repo = SimulatedRepository(records=120, page_size=50, seed=11)
    with OaiSimulator(repo) as sim:
        harness = Harness(sim, conn, oai_partner(retries=3))
        harness.run()
        repo.rewind_clock(timedelta(hours=26))  # a failover to a server a day behind
        harness.run()  # alerts (clock behind the cursor); skips nothing yet
        edited = repo.edit(3)  # stamped a day before our cursor
        repo.advance_clock(timedelta(hours=30))  # the partner's clock passes our cursor again
        harness.run()
    held: dict[str, str] = dict(conn.execute("SELECT identifier, title FROM records WHERE identifier = ANY(%s)", (edited,)).fetchall())
    assert held == {i: title(repo[i]) for i in edited}


def test_edits_made_between_the_clock_jump_and_the_run_that_sees_it_reach_the_mirror(conn: psycopg.Connection) -> None:
    repo = SimulatedRepository(records=120, page_size=50, seed=11)
    with OaiSimulator(repo) as sim:
        harness = Harness(sim, conn, oai_partner(retries=3))
        harness.run()
        repo.rewind_clock(timedelta(hours=26))
        edited = repo.edit(3)  # before the run that will notice the clock behind our cursor
        repo.advance_clock(timedelta(hours=1))  # ... an hour before it: outside the lag
        harness.run()
        repo.advance_clock(timedelta(hours=30))
        harness.run()
    held: dict[str, str] = dict(conn.execute("SELECT identifier, title FROM records WHERE identifier = ANY(%s)", (edited,)).fetchall())
    assert held == {i: title(repo[i]) for i in edited}


def test_versions_stamped_before_the_held_ones_after_a_clock_jump_reach_the_mirror(conn: psycopg.Connection) -> None:
    """Seed 5, night 2 of soak_sierra (``clock_behind_cursor``), reproduced small.

    Records edited just before the partner's clock jumped back are held with stamps
    from the old clock; edited or deleted again after the jump they carry stamps
    *older* than the held version. Ordered by datestamp alone the stale version won
    for good (edits) or until the weekly reconcile (deletions). A run whose partner
    clock is behind the highest clock an applied run saw, by more than the lag,
    observed the partner later: its versions beat held ones stamped after its clock.
    """
    repo = SimulatedRepository(records=120, page_size=50, seed=11)
    with OaiSimulator(repo) as sim:
        harness = Harness(sim, conn, oai_partner(retries=3))
        harness.run()
        repo.advance_clock(timedelta(hours=2))
        recent = repo.edit(6)  # held with stamps of the old clock
        repo.advance_clock(timedelta(hours=1))
        harness.run()
        repo.rewind_clock(timedelta(hours=26))  # a failover to a server a day behind
        harness.run()  # alerts; harvests the whole list up to the partner's clock
        edited, deleted = repo.edit_ids(recent[:3]), repo.delete_ids(recent[3:])
        repo.advance_clock(timedelta(hours=1))
        harness.run()  # the clock is still a day behind what the held versions carry
        assert harness.held() == repo.live_identifiers()
        repo.advance_clock(timedelta(hours=30))  # the clock passes the old one again
        harness.run()
    held: dict[str, str] = dict(conn.execute("SELECT identifier, title FROM records WHERE identifier = ANY(%s)",
                             (edited + deleted,)).fetchall())
    assert held == {i: title(repo[i]) for i in edited}
    assert harness.held() == repo.live_identifiers()


def test_a_clock_behind_stamps_a_full_export_already_held_is_a_regression_too(conn: psycopg.Connection) -> None:
    """Seed 5, soak_sierra night 3, reproduced small: the run that met the clock behind our
    cursor took the whole export, which holds versions stamped before the jump and *after*
    every clock a run had read. The next run's clock was past those clocks, so it was not
    seen as behind, yet behind those stamps: its newer versions, stamped earlier, lost. The
    yardstick is now the latest clock or applied stamp (store/runs.clock_high_water)."""
    catalogue = SimulatedCatalogue(bibs=300, deleted_fraction=0.03, seed=5)
    with SierraSimulator(catalogue, client_key=SIERRA_KEY, client_secret=SIERRA_SECRET) as sim:
        harness = SierraHarness(sim, conn, sierra_partner())
        harness.run("incremental")  # the full load (no cursor)
        harness.cursor = harness.deletions_cursor = catalogue.clock
        catalogue.advance_clock(timedelta(hours=20))
        edited = catalogue.edit(6)  # stamped after every clock a run read so far
        catalogue.advance_clock(timedelta(hours=1))
        catalogue.rewind_clock(timedelta(hours=26))  # a failover to a server a day behind
        harness.run()  # behind the cursor: the whole export, edits included
        catalogue.advance_clock(timedelta(hours=20))  # past the first run's clock, not past the edits
        catalogue.edit_ids(edited)  # again: stamped before the versions held
        catalogue.advance_clock(timedelta(hours=1))
        window, *_ = harness.run()
    assert window.protocol.clock_regressed  # its clock trails stamps already held: set back too
    held: dict[str, str] = dict(conn.execute("SELECT identifier, title FROM records WHERE identifier = ANY(%s)", (edited,)).fetchall())
    assert held == {i: catalogue[i].title.strip() for i in edited}
    assert harness.held() == catalogue.live_ids()


def test_a_version_stamped_while_the_clock_was_behind_beats_one_stamped_before_the_jump(conn: psycopg.Connection) -> None:
    """Seed 2324, soak_sierra_b nights 4-7 (python -m benchmarks.soak --seed 2324 --partners
    soak_sierra_b --nights 7), reproduced small.

    A record edited just before the partner's clock jumped back is held with that stamp,
    observed by the run that met the jump (its clock regressed). Edited again while the
    clock is still behind, its new version carries an *older* stamp; the run that harvests
    it comes after the clock passed the old one again, so it is not regressed itself, and
    ordered by stamp the held version won for good. The held version was observed by a
    regressed run and the new one carries a stamp after that run's clock: the later
    observation is what the partner holds (store/migrations: harvest_version_newer)."""
    catalogue = SimulatedCatalogue(bibs=300, deleted_fraction=0.03, seed=5)
    with SierraSimulator(catalogue, client_key=SIERRA_KEY, client_secret=SIERRA_SECRET) as sim:
        harness = SierraHarness(sim, conn, sierra_partner())
        harness.run("incremental")  # the full load (no cursor)
        harness.cursor = harness.deletions_cursor = catalogue.clock
        catalogue.advance_clock(timedelta(hours=20))
        edited = catalogue.edit(3)  # stamped just before the jump
        catalogue.advance_clock(timedelta(hours=1))
        catalogue.rewind_clock(timedelta(hours=26))  # a failover to a server a day behind
        harness.run()  # behind the cursor: the whole export, the edits with stamps ahead of its clock
        catalogue.advance_clock(timedelta(hours=20))  # still behind the edits' stamps
        catalogue.edit_ids(edited)  # again: stamped after that run's clock, before the held stamps
        catalogue.advance_clock(timedelta(hours=1))
        catalogue.advance_clock(timedelta(hours=20))  # the clock passes the held stamps: not regressed
        harness.run()
    held: dict[str, str] = dict(conn.execute("SELECT identifier, title FROM records WHERE identifier = ANY(%s)", (edited,)).fetchall())
    assert held == {i: catalogue[i].title.strip() for i in edited}
    assert harness.held() == catalogue.live_ids()
