"""Politeness through Airflow: the harvest DAG's tasks pace their requests at the host.

The transport paces every request the tasks send (freeze's Identify and ListMetadataFormats,
the plan, the harvest's pages) through the aggregation database the tasks use; the partner's
row in partner_pacing is what the health page reads.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path

import pytest

from include.simulators.oai_pmh import OaiSimulator, SimulatedRepository
from partner_harvest.store import connect
from partner_harvest.store.pacing import partner_rate
from tests.support import dags
from tests.support.dags import task_states
from tests.support.db import held

pytestmark = pytest.mark.airflow
DELAY_MS = 150


def test_a_harvest_run_keeps_the_request_delay_at_the_simulator(partner_env: OaiSimulator, repo: SimulatedRepository, db: str,
                                                                registry: Callable[[str], Path]) -> None:
    registry(
        "partners:\n"
        "  - {id: dagmuseum, protocol: oai-pmh, conn_id: partner_dagmuseum, metadata_prefix: auto,\n"
        f"     lag: 5m, request_delay: {DELAY_MS}, options: {{http: {{backoff_factor: 0.01, retries: 2}}}}}}\n"
    )
    run = partial(dags.build_dag, "dagmuseum")().test()
    assert set(task_states(run).values()) <= {"success", "skipped"}, task_states(run)
    assert held(db, "dagmuseum") == repo.live_identifiers()
    arrivals = sorted(partner_env.arrivals)
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:])]
    assert len(arrivals) >= 5  # Identify, ListMetadataFormats, the plan's probe, the pages
    assert min(gaps) >= DELAY_MS / 1000 * 0.8, gaps  # unpaced, the tasks' requests follow in ms
    with connect(db) as conn:
        rate = partner_rate(conn, "dagmuseum")
    assert rate is not None and rate.host == "127.0.0.1" and rate.delay_ms == DELAY_MS
    assert rate.limit_per_s == pytest.approx(1000 / DELAY_MS)
