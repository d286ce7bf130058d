"""The short soak: a few chaos nights of every partner kind through Airflow,
every fault kind at least once across them, and after every night the mirror equals
the partner. The long soak is ``python -m benchmarks.soak`` (docs/design/soak.md).

A failing night replays alone: ``python -m benchmarks.soak --seed <seed> --partners
<partner> --nights <night>`` (the plan below fixes the faults; the seed the rest).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from benchmarks.soak.driver import FAST_WAITS, Soak, summary
from benchmarks.soak.faults import FAULTS, PAUSES
from include import embedded_pg

pytestmark = [pytest.mark.soak, pytest.mark.airflow]

SOAK_TIMEOUT = 600  # 30 nights of a few seconds each, plus Airflow's start: ~3 min, more when loaded
SEED = 8

# Every fault kind at least once (31 kinds, 34 nights; the items partner's nights repeat two):
# night 1 of a Sierra partner is its full load (the export's faults), a failed night is
# followed by one that must converge, deletedRecord=no reconciles every 3rd (and on the
# night of its reconcile's pause). The pauses here stop a task holding its lease
# (``kind@moment``), so its resumed write meets the fence; the long soak draws the moment.
PLAN = {
    ("soak_persistent", 1): "kill_mid_page",
    ("soak_persistent", 2): "kill_between_harvest_and_apply",
    ("soak_persistent", 3): "token_repeated",
    ("soak_persistent", 4): "throttle_503_retry_after",
    ("soak_persistent", 5): "token_expired",
    ("soak_persistent", 6): "pause_after_freeze@lease:plan_slices",
    ("soak_persistent", 7): "refused_after_quiet_outage",
    ("soak_no_deletions", 1): "throttle_429_retry_after",
    ("soak_no_deletions", 2): "storm_5xx",
    ("soak_no_deletions", 3): "pg_restart_mid_apply",
    ("soak_no_deletions", 4): "broken_xml",
    ("soak_no_deletions", 5): "pause_reconcile_before_removals@reconcile:removals",
    ("soak_no_deletions", 6): "approved_after_quiet_night",
    ("soak_daily", 1): "kill_mid_apply",
    ("soak_daily", 2): "clock_backwards",
    ("soak_daily", 3): "pg_restart_before_apply",
    ("soak_daily", 4): "kill_after_apply_before_cursor",
    ("soak_daily", 5): "pause_before_cursor@lease:advance_cursor",
    ("soak_sierra", 1): "sierra_export_138",
    ("soak_sierra", 2): "sierra_401_mid_run",
    ("soak_sierra", 3): "sierra_deletion_poll_500",
    ("soak_sierra", 4): "drop_conn_mid_copy",
    ("soak_sierra", 5): "forget_in_retry_wait",
    ("soak_sierra", 6): "pause_mid_page",
    ("soak_sierra_b", 1): "sierra_export_135",
    ("soak_sierra_b", 2): "clock_behind_cursor",
    ("soak_sierra_b", 3): "pg_restart_mid_page",
    ("soak_sierra_b", 4): "reset_cursor_in_retry_wait",
    ("soak_sierra_b", 5): "pause_before_apply@lease:apply_changes",
    ("soak_sierra_c", 1): "sierra_keep_alive_poison",
    ("soak_sierra_items", 1): "pg_restart_mid_apply",  # items and holdings: the apply of their first load
    ("soak_sierra_items", 2): "sierra_item_poll_500",
    ("soak_sierra_items", 3): "kill_mid_page",
    ("soak_iiif", 1): "throttle_503_retry_after",  # a stream's first load, in slices of its page chain
}


@pytest.mark.skipif(bool(os.environ.get(embedded_pg.DATABASE_URL_ENV)),
                    reason="restarts the embedded PostgreSQL server")
@pytest.mark.timeout(SOAK_TIMEOUT)
def test_short_soak_converges_after_every_night(airflow_db: None, db: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                pg_label: str) -> None:
    nights: dict[str, int] = {}
    for partner, night in PLAN:
        nights[partner] = max(nights.get(partner, 0), night)
    soak = Soak(seed=SEED, nights=nights, partners=list(nights), conninfo=db, pg_label=pg_label,
                workdir=tmp_path, reconcile_every=3, plan=PLAN, size=200, waits=FAST_WAITS)
    results = soak.run()
    table = summary(results, SEED)
    with capsys.disabled():
        print("\n" + "\n".join(Soak._line(r) for r in results) + "\n" + table)

    assert not [(r.partner, r.night, r.divergence) for r in results if r.divergence], table
    assert {r.fault for r in results if r.fired} >= {k for k, f in FAULTS.items() if not f.known_gap}, table
    for r in results:
        if r.fault in PAUSES:  # stopped, held past its lease, then another run or a command in between
            assert r.fired and r.interloper.endswith(("success", "exit 0")), (r.partner, r.night, r.interloper)
        if "@lease:" in PLAN.get((r.partner, r.night), "") or r.fault == "pause_reconcile_before_removals":
            assert r.task_retries >= 1, (r.partner, r.night, "the resumed task's write should have met the fence")
        if r.fault.endswith("_in_retry_wait"):  # the retry is fenced: nothing of the run applies
            assert r.outcome == "next-night", (r.partner, r.night, r.outcome, r.notes)
        if r.fault == "refused_after_quiet_outage":  # the night itself harvests the grown window
            assert r.outcome in ("clean", "retried"), (r.partner, r.night, r.outcome, r.notes)
        if r.fault == "approved_after_quiet_night":  # the quiet night ran during the wait; the approval held
            assert r.interloper == "quiet harvest success" and "reconcile failed" not in r.notes, (
                r.partner, r.night, r.interloper, r.notes)
    last = {}
    for r in results:
        last[r.partner] = r
    assert {p: r.checked for p, r in last.items()} == {p: "strict" for p in last}  # converged at the end
