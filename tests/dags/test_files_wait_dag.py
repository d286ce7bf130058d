"""A file partner's delta copied in halfway (its checksum file lists the whole one), through
Airflow itself (``dag.test()``): the run waits, it does not fail. ``harvest_changes`` is
skipped saying which file, which delivery and both digests, the apply, the cursor and the
quality check are skipped after it, the run succeeds, no alert is sent, the cursor stays;
the night the partner's file matches, it applies.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import fsspec
import pytest

from include.simulators.files.publisher import OPTIONS, Publisher
from partner_harvest.registry import get_partner
from partner_harvest.store import connect, ensure_schema
from tests.support.dags import get_cursor, set_cursor

if TYPE_CHECKING:
    from airflow.models.dagrun import DagRun

pytestmark = pytest.mark.airflow
PARTNER = "waiting_files"
DAY0, DAY1 = datetime(2026, 6, 15, tzinfo=timezone.utc), datetime(2026, 6, 16, tzinfo=timezone.utc)


def states(run: DagRun) -> dict[str, str]:
    return {ti.task_id: str(getattr(ti.state, "value", ti.state)) for ti in run.get_task_instances()}


def test_a_delta_not_matching_its_checksum_waits_without_failing(
        registry: Callable[[str], Path], aggregation_conn: str, airflow_db: None, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    from partner_harvest.airflow import notifiers
    from partner_harvest.airflow.dag_factory import build_harvest_dag

    files = {**OPTIONS, "done_marker": None, "checksums": "{date:%Y%m%d}/SHA256SUMS"}
    registry("partners:\n"
             f"  - {{id: {PARTNER}, protocol: file-delivery, conn_id: partner_{PARTNER}, retries: 0, lag: 0s,\n"
             f"     options: {{files: {json.dumps(files)}}}}}\n")
    folder = tmp_path / "dumps"
    monkeypatch.setenv(f"AIRFLOW_CONN_PARTNER_{PARTNER.upper()}",
                       json.dumps({"conn_type": "file_delivery", "host": f"file://{folder}"}))
    alerts: list[str] = []

    def send_alert(subject: str, *rest: object) -> list[str]:
        alerts.append(subject)
        return ["test"]

    monkeypatch.setattr(notifiers, "send_alert", send_alert)
    set_cursor(PARTNER, None)
    museum = Publisher(fsspec.filesystem("file"), str(folder))
    museum.create(40)
    museum.full(DAY0, sums=True, marker=False)
    first = build_harvest_dag(get_partner(PARTNER)).test()
    assert str(getattr(first.state, "value", first.state)) == "success", states(first)
    assert get_cursor(PARTNER)["until"] == "2026-06-15T00:00:00Z"

    museum.edit(4)
    delta = folder / museum.delta(DAY1, sums=True, marker=False)
    whole = delta.read_bytes()
    delta.write_bytes(whole[:whole.index(b"\r\n", len(whole) // 2) + 2])  # still being copied in
    waited = build_harvest_dag(get_partner(PARTNER)).test()
    task_states = states(waited)
    assert str(getattr(waited.state, "value", waited.state)) == "success", task_states
    assert task_states["harvest_changes"] == "skipped", task_states
    assert {task_states[t] for t in ("approval_gate", "apply_changes", "advance_cursor", "check_quality")} == {"skipped"}
    assert alerts == [] and get_cursor(PARTNER)["until"] == "2026-06-15T00:00:00Z"
    key = f"{waited.dag_id}/{waited.run_id}"
    with connect(aggregation_conn) as conn:
        ensure_schema(conn)
        event: Any = conn.execute("SELECT kind, task_id, message FROM run_events WHERE run_id = %s", (key,)).fetchall()
        audit = conn.execute("SELECT status, error FROM harvest_runs WHERE run_id = %s", (key,)).fetchall()
    assert len(event) == 1 and event[0][:2] == ("skipped", "harvest_changes"), event
    reason = event[0][2]
    assert reason.startswith("the delta of 2026-06-16T00:00:00Z: 20260616/delta/changes.csv: sha256 ")
    assert reason.endswith("waiting for the partner to finish the upload")
    assert audit == [("abandoned", f"waiting: {reason}")]

    delta.write_bytes(whole)  # the upload finished
    applied = build_harvest_dag(get_partner(PARTNER)).test()
    assert str(getattr(applied.state, "value", applied.state)) == "success", states(applied)
    assert set(states(applied).values()) == {"success"}, states(applied)
    assert get_cursor(PARTNER)["until"] == "2026-06-16T00:00:00Z" and alerts == []
    set_cursor(PARTNER, None)
