"""Chaos nights on a real scheduler: the task process the scheduler launched is
SIGKILLed at each of the four moments (as it asks for a page; as the apply starts, after
the harvest; inside the apply's transaction; as the cursor task starts, after the apply),
and the scheduler itself retries it after the registry's ``retry_delay``. After every night
the soak's checks hold: the mirror equals the partner.

The full run, one night per fault kind on the scheduler, is a command (docs/design/soak.md, "Chaos
nights"): ``python -m benchmarks.soak --scheduler --per-kind --seed 2026``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from benchmarks.soak.driver import FAST_WAITS, Partner, Soak, summary

pytestmark = [pytest.mark.e2e, pytest.mark.soak]

SEED = 11
PARTNER = "soak_persistent"
PLAN = {
    (PARTNER, 1): "kill_mid_page",
    (PARTNER, 2): "kill_between_harvest_and_apply",
    (PARTNER, 3): "kill_mid_apply",
    (PARTNER, 4): "kill_after_apply_before_cursor",
}
KILLED_TASK = {  # the task whose process dies, so whose try the scheduler repeats
    "kill_mid_page": "harvest_changes",
    "kill_between_harvest_and_apply": "apply_changes",
    "kill_mid_apply": "apply_changes",
    "kill_after_apply_before_cursor": "advance_cursor",
}


def test_sigkilled_tasks_are_retried_by_the_scheduler_and_the_mirror_converges(
        db: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], pg_server: str, pg_label: str, airflow_metadata_template: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    tries: dict[int, dict[str, int]] = {}
    # No night restarts PostgreSQL, so Airflow's metadata database may sit beside the
    # aggregation database: a copy of the session's migrated one (tests/e2e/conftest.py).
    soak = Soak(seed=SEED, nights={PARTNER: len(PLAN)}, partners=[PARTNER], conninfo=db, pg_label=pg_label,
                workdir=tmp_path, plan=PLAN, size=60, scheduler=True, waits=FAST_WAITS,
                airflow_metadata=(pg_server, airflow_metadata_template))
    scheduled = soak._scheduled

    def keep_tries(partner: Partner, night: int, kind: str, moment: str = "",
                   action: str = "") -> tuple[dict[str, Any], bool]:
        data, fired = scheduled(partner, night, kind, moment, action)
        tries[night] = {task: v["tries"] for task, v in data["tasks"].items()}
        return data, fired

    monkeypatch.setattr(soak, "_scheduled", keep_tries)
    results = soak.run()
    table = summary(results, SEED)
    with capsys.disabled():
        print("\n" + table)  # the nights' lines were printed as they ended

    assert not [(r.night, r.divergence) for r in results if r.divergence], table
    assert [(r.night, r.fault) for r in results] == [(n, k) for (_, n), k in PLAN.items()], table
    for r in results:
        assert r.fired and r.checked == "strict" and r.attempts == 1, (r, table)
        # Retried by the scheduler: the killed task's second try succeeded, every other task ran once.
        assert r.outcome == "retried", (r, table)
        killed = KILLED_TASK[r.fault]
        assert tries[r.night][killed] == 2, (r.night, tries[r.night])
        assert all(t == 1 for task, t in tries[r.night].items() if task != killed), (r.night, tries[r.night])
