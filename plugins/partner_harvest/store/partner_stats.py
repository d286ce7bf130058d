"""Per-partner counters kept in step by the apply transaction (table ``partner_stats``).

Records are written only by :func:`partner_harvest.store.apply.apply_run` (and removed
wholesale by ``admin.forget_partner``, which drops the counter too), so a delta added in
the same transaction keeps ``records_held`` equal to ``count(*)`` without ever counting.
"""

from __future__ import annotations

import psycopg

_ADD_HELD = """
INSERT INTO partner_stats AS s (partner_id, records_held) VALUES (%s, %s)
ON CONFLICT (partner_id) DO UPDATE SET records_held = s.records_held + EXCLUDED.records_held, updated_at = now()
RETURNING records_held
"""


def add_records_held(conn: psycopg.Connection, partner_id: str, run_id: str, delta: int) -> int:
    """Add ``delta`` (new records minus purged ones) to the partner's counter and note the
    result on the run's audit rows; call inside the apply transaction. Returns the new count."""
    (held,) = conn.execute(_ADD_HELD, (partner_id, delta)).fetchone()
    conn.execute("UPDATE harvest_runs SET records_held = %s WHERE partner_id = %s AND run_id = %s",
                 (held, partner_id, run_id))
    return held
