"""What the soak found, each reproduced small (without Airflow, on the pipeline the tasks call).

A partner clock that jumps back past our cursor (seed 5, ``clock_backwards`` with the
clock set back 26 hours, see the README's "Chaos nights"): the run that meets it alerts
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

from include.simulators.oai_pmh import OaiSimulator, SimulatedRepository, title
from tests.integration.test_oai_harvest import Harness, partner


def test_edits_made_while_the_partner_clock_is_behind_the_cursor_reach_the_mirror(conn) -> None:
    repo = SimulatedRepository(records=120, page_size=50, seed=11)
    with OaiSimulator(repo) as sim:
        harness = Harness(sim, conn, partner())
        harness.run()
        repo.rewind_clock(timedelta(hours=26))  # a failover to a server a day behind
        harness.run()  # alerts (clock behind the cursor); skips nothing yet
        edited = repo.edit(3)  # stamped a day before our cursor
        repo.advance_clock(timedelta(hours=30))  # the partner's clock passes our cursor again
        harness.run()
    held = dict(conn.execute("SELECT identifier, title FROM records WHERE identifier = ANY(%s)", (edited,)).fetchall())
    assert held == {i: title(repo.get(i)) for i in edited}


def test_edits_made_between_the_clock_jump_and_the_run_that_sees_it_reach_the_mirror(conn) -> None:
    repo = SimulatedRepository(records=120, page_size=50, seed=11)
    with OaiSimulator(repo) as sim:
        harness = Harness(sim, conn, partner())
        harness.run()
        repo.rewind_clock(timedelta(hours=26))
        edited = repo.edit(3)  # before the run that will notice the clock behind our cursor
        repo.advance_clock(timedelta(hours=1))  # ... an hour before it: outside the lag
        harness.run()
        repo.advance_clock(timedelta(hours=30))
        harness.run()
    held = dict(conn.execute("SELECT identifier, title FROM records WHERE identifier = ANY(%s)", (edited,)).fetchall())
    assert held == {i: title(repo.get(i)) for i in edited}
