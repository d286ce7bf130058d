"""A quiet night is one task process and two requests, with every guarantee.

On main a quiet night ran six task processes and sent three requests (Identify,
ListMetadataFormats for ``metadata_prefix: auto``, ListRecords):
``test_a_quiet_night_is_one_task_and_two_requests`` fails there on the task states and on
the request count.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any

import pytest

from include.simulators.oai_pmh import OaiSimulator, SimulatedRepository
from partner_harvest.store import connect
from partner_harvest.store.db import one
from tests.support import dags
from tests.support.dags import task_states
from tests.support.db import held as support_held

if TYPE_CHECKING:
    from airflow.models.dagrun import DagRun

pytestmark = pytest.mark.airflow
PARTNER = "dagmuseum"  # tests/dags/conftest.py (partner_env): metadata_prefix auto
get_cursor = partial(dags.get_cursor, PARTNER)
held = partial(support_held, partner_id=PARTNER)


def verbs(sim: OaiSimulator, since: int) -> list[str]:
    return [r.get("verb", "?") for r in sim.requests[since:]]


def run_row(db: str, run: DagRun) -> tuple[Any, ...]:
    with connect(db) as conn:
        return one(conn.execute("SELECT status, fetched, pages FROM harvest_runs WHERE partner_id = %s AND run_id = %s"
                            " AND channel = 'changes'", (PARTNER, f"{run.dag_id}/{run.run_id}")))


def asset_event_sources() -> list[str]:
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session

    with create_session() as session:
        rows = (session.query(AssetEvent).join(AssetModel, AssetEvent.asset_id == AssetModel.id)
                .filter(AssetModel.uri == f"partner-harvest://{PARTNER}/records").order_by(AssetEvent.id).all())
        return [str(row.source_task_id) for row in rows]


@pytest.mark.slow  # four dag.test() runs
@pytest.mark.timeout(600)
def test_a_quiet_night_is_one_task_and_two_requests(partner_env: OaiSimulator, repo: SimulatedRepository, db: str) -> None:
    sim = partner_env
    dag = dags.build_dag(PARTNER)
    first = dag.test()  # the first harvest: asks ListMetadataFormats once and remembers the choice
    assert str(first.state).endswith("success"), task_states(first)
    assert "ListMetadataFormats" in verbs(sim, 0)

    repo.advance_clock(600)
    mark = len(sim.requests)
    second = dag.test()  # nothing changed, but the night before fetched records: the usual way
    assert set(task_states(second).values()) == {"success"}, task_states(second)
    assert verbs(sim, mark) == ["Identify", "ListRecords"]  # the remembered prefix: no ListMetadataFormats
    assert run_row(db, second)[:2] == ("applied", 0)

    repo.advance_clock(600)
    mark, events = len(sim.requests), len(asset_event_sources())
    third = dag.test()  # quiet after quiet: freeze_window does it all
    states = task_states(third)
    assert states.pop("freeze_window") == "success" and set(states.values()) == {"skipped"}, task_states(third)
    assert verbs(sim, mark) == ["Identify", "ListRecords"]
    assert run_row(db, third) == ("applied", 0, 1)  # applied (harvest_runs), as apply_changes records it
    assert get_cursor()["until"] == repo.clock.strftime("%Y-%m-%dT%H:%M:%SZ")  # moved after the apply
    assert len(asset_event_sources()) == events + 1  # the Asset event consumers rely on, via the alias
    assert held(db) == repo.live_identifiers()

    repo.advance_clock(600)
    repo.edit(3)
    mark = len(sim.requests)
    fourth = dag.test()  # the look finds changes: the usual tasks harvest them
    assert set(task_states(fourth).values()) == {"success"}, task_states(fourth)
    assert verbs(sim, mark).count("ListRecords") == 2  # the look, then the harvest
    assert run_row(db, fourth)[:2] == ("applied", 3)
    assert held(db) == repo.live_identifiers()
    assert get_cursor()["until"] == repo.clock.strftime("%Y-%m-%dT%H:%M:%SZ")


class Sent:
    """What the run's tasks report to Airflow's surface: Stats (metrics) and the hook lineage
    collector (lineage), recorded in this process (dag.test() runs every task here)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from airflow.sdk import lineage
        from airflow.sdk.observability import stats

        self.metrics: list[tuple[str, str]] = []
        self.lineage: list[tuple[str, str]] = []
        for kind in ("incr", "gauge", "timing"):
            monkeypatch.setattr(stats, kind, partial(self._metric, kind))
        monkeypatch.setattr(lineage, "get_hook_lineage_collector", lambda: self)

    def _metric(self, kind: str, name: str, *args: Any, **kwargs: Any) -> None:
        self.metrics.append((kind, name))

    def add_input_asset(self, context: Any = None, uri: str = "", **kwargs: Any) -> None:
        self.lineage.append(("input", uri))

    def add_output_asset(self, context: Any = None, uri: str = "", **kwargs: Any) -> None:
        self.lineage.append(("output", uri))

    def night(self, dag: Any) -> tuple[DagRun, set[tuple[str, str]], set[tuple[str, str]]]:
        """One run, with the metrics and lineage its tasks reported (as sets: which, not how often)."""
        self.metrics.clear()
        self.lineage.clear()
        return dag.test(), set(self.metrics), set(self.lineage)


@pytest.mark.timeout(600)
def test_a_quiet_night_reports_the_metrics_and_lineage_of_an_ordinary_night(partner_env: OaiSimulator, repo: SimulatedRepository,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A quiet night applies a run as an ordinary night does: it reports the same metrics
    (runs_applied, run_seconds, cursor_lag_seconds, the apply's counts) and the same lineage
    (staging written and read, the live tables written)."""
    sent = Sent(monkeypatch)
    dag = dags.build_dag(PARTNER)
    first, _, _ = sent.night(dag)  # the first harvest fetches the collection
    assert str(first.state).endswith("success"), task_states(first)

    repo.advance_clock(600)
    ordinary, ordinary_metrics, ordinary_lineage = sent.night(dag)  # nothing changed: the usual tasks
    assert set(task_states(ordinary).values()) == {"success"}, task_states(ordinary)

    repo.advance_clock(600)
    quiet, quiet_metrics, quiet_lineage = sent.night(dag)  # quiet after quiet: freeze_window does it all
    states = task_states(quiet)
    assert states.pop("freeze_window") == "success" and set(states.values()) == {"skipped"}, task_states(quiet)

    assert {name for _, name in ordinary_metrics} >= {f"partner_harvest.{key}.{PARTNER}" for key in (
        "runs_applied", "run_seconds", "cursor_lag_seconds", "fetched", "upserted", "warnings")}
    assert sorted(quiet_metrics) == sorted(ordinary_metrics)
    assert {direction for direction, _ in ordinary_lineage} == {"input", "output"}
    assert sorted(quiet_lineage) == sorted(ordinary_lineage)
