"""The sliced reconcile's plan as its tasks pass it on (XCom)."""

from __future__ import annotations

from datetime import datetime, timezone

from partner_harvest.sliced_reconcile import SweepPlan
from partner_harvest.window import Window


def test_the_plans_time_survives_xcom_to_the_microsecond() -> None:
    """The slices refuse when a run applied after ``planned_at`` (the database's now()).
    Cut to the second on its way through XCom, it moved back before a harvest that applied
    earlier in the same second, and every slice refused a sound sweep as stale (SweepStale,
    no retry): seen in CI as all four slices of
    tests/dags/test_sliced_reconcile_dag.py failing on their first try."""
    until = datetime(2026, 1, 1, tzinfo=timezone.utc)
    planned_at = datetime(2026, 1, 1, 0, 0, 5, 730_412, tzinfo=timezone.utc)
    plan = SweepPlan(Window("full", None, until, "seconds", False), planned_at, 4)
    again = SweepPlan.from_dict(plan.to_dict())
    assert again.planned_at == planned_at
    assert again.slices == 4 and again.window.until == until
