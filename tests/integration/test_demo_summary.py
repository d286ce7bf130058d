"""The demo's summary labels what happened: a first run is a full harvest, and deletions of
records an empty database never held are not 'lost' in `unchanged`."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import psycopg

from include.simulators.oai_pmh import OaiSimulator, SimulatedRepository
from partner_harvest.factory import Endpoint, build_adapter
from partner_harvest.run import run_partner
from tests.support.partners import oai_partner

ROOT = Path(__file__).resolve().parents[2]


def demo_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("demo_script", ROOT / "scripts" / "demo.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_first_run_is_labelled_full_and_absent_deletions_are_named(conn: psycopg.Connection) -> None:
    demo = demo_module()
    partner = oai_partner(retries=1)
    repo = SimulatedRepository(records=200, page_size=50, deleted_fraction=0.05, seed=3)
    tombstones = len(repo.deleted_identifiers())
    cursors: dict = {}
    with OaiSimulator(repo) as sim:
        adapter = build_adapter(partner, Endpoint(sim.base_url))
        for number in (1, 2):
            cursors = run_partner(partner, adapter, conn, f"harvest_museum/run{number}", cursors).cursors
            if number == 1:
                repo.edit(2)
    lines = demo.summary_lines(conn, "museum")
    first, second = lines[2], lines[3]
    assert first.startswith("  full (first harvest)") and "(everything)" in first
    assert second.startswith("  incremental ")
    (note,) = [line for line in lines if "already absent" in line]
    absent = int(note.split(": ")[1].split()[0])
    assert note.startswith("  harvest_museum/run1:") and absent == tombstones > 0
