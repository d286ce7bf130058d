"""The harvest DAG a registry window builds runs at the partner's spread minute."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from partner_harvest.schedule_spread import spread_minute, spread_schedule

if TYPE_CHECKING:
    from airflow.sdk import DAG
    from airflow.serialization.serialized_objects import SerializedDAG
    from airflow.timetables.base import TimeRestriction

ROOT = Path(__file__).resolve().parents[2]
REGISTRY = """partners:
  - {id: museum_a, protocol: oai-pmh, conn_id: c_a, schedule_window: "02:00-05:00"}
  - {id: museum_b, protocol: oai-pmh, conn_id: c_b, schedule_window: "02:00-05:00"}
  - {id: museum_c, protocol: oai-pmh, conn_id: c_c}
"""


def test_the_generated_dag_runs_at_the_spread_minute(registry: Callable[[str], Path], airflow_db: None) -> None:
    from airflow.dag_processing.dagbag import DagBag

    registry(REGISTRY)
    bag = DagBag(dag_folder=str(ROOT / "dags" / "partner_harvest.py"))
    assert bag.import_errors == {}
    starts = {}
    for pid in ("museum_a", "museum_b"):
        dag = bag.get_dag(f"harvest_{pid}")
        assert dag.timetable.expression == spread_schedule(pid, "02:00-05:00")
        # The scheduler's own timetable, from the serialised DAG: when would it run next?
        timetable = _scheduler_dag(dag).timetable
        after = datetime(2026, 3, 1, tzinfo=timezone.utc)
        info = timetable.next_dagrun_info(last_automated_data_interval=None,
                                          restriction=_restriction(after))
        assert info is not None
        starts[pid] = info.run_after
        minute = info.run_after.hour * 60 + info.run_after.minute
        assert minute == spread_minute(pid, "02:00-05:00") and 120 <= minute < 300
    assert starts["museum_a"] != starts["museum_b"]  # two partners, two minutes (not both at 02:00)
    assert bag.get_dag("harvest_museum_c").timetable.expression == "0 2 * * *"


def _scheduler_dag(dag: DAG) -> SerializedDAG:
    from airflow.serialization.serialized_objects import DagSerialization

    return DagSerialization.from_dict(DagSerialization.to_dict(dag))


def _restriction(earliest: datetime) -> TimeRestriction:
    import pendulum
    from airflow.timetables.base import TimeRestriction

    return TimeRestriction(earliest=pendulum.instance(earliest), latest=None, catchup=False)
