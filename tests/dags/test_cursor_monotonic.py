"""I1, the real case: a run that froze an older window applies after a newer run moved the
cursor. The cursor stays where the newer run put it, and nothing reports a move.

(``test_an_older_run_never_rewinds_the_cursor`` sets the cursor in the future before the
run freezes its window, so planning lifts the window's until up to the cursor and the run
never holds an older until: it cannot see a rewind.)
"""

from __future__ import annotations

import json
from functools import partial
from typing import TYPE_CHECKING, Any

import pytest

from include.simulators.oai_pmh import OaiSimulator, SimulatedRepository
from partner_harvest.window import format_instant
from tests.support import dags
from tests.support.dags import task_states

if TYPE_CHECKING:
    from airflow.models.dagrun import DagRun

set_cursor = partial(dags.set_cursor, "dagmuseum")  # partner_env, repo: tests/dags/conftest.py
get_cursor = partial(dags.get_cursor, "dagmuseum")
build_dag = partial(dags.build_dag, "dagmuseum")

pytestmark = pytest.mark.airflow


def cursor_outcome(run_id: str) -> dict:
    """What the run's advance_cursor task reported (its XCom)."""
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        row = session.query(XComModel).filter(
            XComModel.dag_id == "harvest_dagmuseum", XComModel.run_id == run_id,
            XComModel.task_id == "advance_cursor", XComModel.key == "return_value",
        ).one()
        value = row.value
    return json.loads(value) if isinstance(value, str) else value


def run_with_a_concurrent_cursor_write(monkeypatch: pytest.MonkeyPatch, written: dict[str, Any]) -> DagRun:
    """dag.test() a run that has frozen its window; while it applies, another run of the
    partner finishes and writes ``written`` to the cursor Variable."""
    from partner_harvest import pipeline

    real_apply = pipeline.apply_changes

    def other_run_finishes_first(*args: Any, **kwargs: Any) -> Any:
        set_cursor(written)
        return real_apply(*args, **kwargs)

    monkeypatch.setattr(pipeline, "apply_changes", other_run_finishes_first)
    run = build_dag().test()
    states = task_states(run)
    assert states["apply_changes"] == "success" and states["advance_cursor"] == "success", states
    return run


def test_an_older_run_applying_after_a_newer_one_keeps_the_newer_cursor(
    partner_env: OaiSimulator, repo: SimulatedRepository, monkeypatch: pytest.MonkeyPatch
) -> None:
    frozen_until = format_instant(repo.clock)  # T1: the simulator's clock, frozen by the run
    newer = {"until": "2026-06-01T00:00:00Z", "granularity": "seconds", "run_id": "newer-run"}  # T2 > T1
    assert newer["until"] > frozen_until
    run = run_with_a_concurrent_cursor_write(monkeypatch, newer)
    assert get_cursor() == newer  # not rewound, not even rewritten
    outcome = cursor_outcome(run.run_id)["changes"]
    assert outcome["moved"] is False and outcome["cursor"] == newer["until"], outcome


def test_a_run_applying_after_an_older_one_still_moves_the_cursor_forward(
    partner_env: OaiSimulator, repo: SimulatedRepository, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The other side of the same guard: forward moves happen, and say so."""
    frozen_until = format_instant(repo.clock)
    older = {"until": "2025-06-01T00:00:00Z"}
    run = run_with_a_concurrent_cursor_write(monkeypatch, older)
    assert get_cursor()["until"] == frozen_until
    outcome = cursor_outcome(run.run_id)["changes"]
    assert outcome["moved"] is True and outcome["previous"] == older["until"], outcome


@pytest.mark.parametrize("conf", [{"mode": "full"},
                                  {"mode": "window", "from": "2025-01-01T00:00:00Z", "until": "2026-12-31T00:00:00Z"}])
def test_a_full_or_window_run_leaves_an_unset_cursor_unset(partner_env: OaiSimulator, conf: dict) -> None:
    """Only incremental runs move the cursor; a manual run on a new partner must not
    start its cursor (the next nightly run would skip what this window did not cover)."""
    run = build_dag().test(run_conf=conf)
    states = task_states(run)
    assert states["apply_changes"] == "success" and states["advance_cursor"] == "success", states
    assert get_cursor() is None
    outcome = cursor_outcome(run.run_id)["changes"]
    assert outcome["moved"] is False and outcome["reason"] == f"{conf['mode']} runs never move the cursor", outcome
