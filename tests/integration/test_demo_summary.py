"""The demo's summary labels what happened: a first run is a full harvest, and deletions of
records an empty database never held are not 'lost' in `unchanged`."""

from __future__ import annotations

import importlib.util
from datetime import timedelta
from pathlib import Path

from include.simulators.oai_pmh import OaiSimulator, SimulatedRepository
from partner_harvest import pipeline
from partner_harvest.factory import Endpoint, build_adapter
from partner_harvest.registry import Partner
from partner_harvest.store import RunRef
from partner_harvest.window import next_cursor

ROOT = Path(__file__).resolve().parents[2]


def demo_module():
    spec = importlib.util.spec_from_file_location("demo_script", ROOT / "scripts" / "demo.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_first_run_is_labelled_full_and_absent_deletions_are_named(conn) -> None:
    demo = demo_module()
    partner = Partner(id="museum", protocol="oai-pmh", conn_id="unused", metadata_prefix="oai_dc",
                      lag=timedelta(minutes=10), options={"http": {"backoff_factor": 0.01, "retries": 1}})
    repo = SimulatedRepository(records=200, page_size=50, deleted_fraction=0.05, seed=3)
    tombstones = len(repo.deleted_identifiers())
    cursor = None
    with OaiSimulator(repo) as sim:
        adapter = build_adapter(partner, Endpoint(sim.base_url))
        for number in (1, 2):
            window = pipeline.freeze_window(adapter, partner.lag, cursor, pipeline.RunRequest("incremental"))
            pipeline.harvest_window(adapter, conn, RunRef("museum", f"harvest_museum/run{number}"), window)
            pipeline.apply_changes(conn, "museum", f"harvest_museum/run{number}")
            cursor = next_cursor(cursor, window)
            if number == 1:
                repo.edit(2)
    lines = demo.summary_lines(conn, "museum")
    first, second = lines[2], lines[3]
    assert first.startswith("  full (first harvest)") and "(everything)" in first
    assert second.startswith("  incremental ")
    (note,) = [line for line in lines if "already absent" in line]
    absent = int(note.split(": ")[1].split()[0])
    assert note.startswith("  harvest_museum/run1:") and absent == tombstones > 0
