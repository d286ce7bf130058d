"""The health benchmark's data builder at 1,000 partners and more.

Regression: ``benchmarks/health_page.py --partners 1000`` failed building its data: the SQL
made the partner ids with a 3-digit ``lpad``, which cuts '1000' to '100', so partner 1000's
runs collided with partner 100's (a unique violation on ``harvest_runs``), while the Python
side (``f"bench{p:03d}"``) named it ``bench1000``.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import psycopg

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _benchmark() -> ModuleType:
    sys.path.insert(0, str(BENCHMARKS))
    try:
        spec = importlib.util.spec_from_file_location("health_page_benchmark", BENCHMARKS / "health_page.py")
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCHMARKS))


def test_the_health_benchmark_builds_1000_partners_with_the_ids_the_page_asks_for(conn: psycopg.Connection) -> None:
    bench = _benchmark()
    bench.build(conn, 1001, 1, days=2, weeks=1, quarantined=1)
    built = [row[0] for row in conn.execute("SELECT partner_id FROM partner_stats ORDER BY partner_id")]
    asked = sorted(f"bench{p:03d}" for p in range(1, 1002))
    assert built == asked
    runs = conn.execute("SELECT count(DISTINCT partner_id) FROM harvest_runs").fetchone()
    assert runs == (1001,)
