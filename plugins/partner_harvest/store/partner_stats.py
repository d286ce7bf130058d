"""Per-partner counters kept in step by the apply transaction (table ``partner_stats``).

Records and quarantine are written only by :func:`partner_harvest.store.apply.apply_run`
(and removed wholesale by ``admin.forget_partner``, which drops the counters too), so what
the apply updates in its own transaction stays equal to what counting would say, and the
health page never counts: ``records_held`` gets a delta (new records minus purged ones);
``quarantined_now`` is recounted from ``quarantine_current`` for this one partner (its
quarantine only, through the (partner_id, identifier) index).
"""

from __future__ import annotations

import psycopg

from partner_harvest.store.db import one

_UPDATE = """
INSERT INTO partner_stats AS s (partner_id, records_held, quarantined_now)
VALUES (%(pid)s, %(delta)s, (SELECT count(*) FROM quarantine_current WHERE partner_id = %(pid)s))
ON CONFLICT (partner_id) DO UPDATE SET records_held = s.records_held + EXCLUDED.records_held,
    quarantined_now = EXCLUDED.quarantined_now, updated_at = now()
RETURNING records_held
"""


def update_partner_stats(conn: psycopg.Connection, partner_id: str, run_id: str, held_delta: int) -> int:
    """Bring the partner's counters up to date after the apply's writes, and note what is held
    on the run's audit rows (the health chart); call inside the apply transaction."""
    (held,) = one(conn.execute(_UPDATE, {"pid": partner_id, "delta": held_delta}))
    conn.execute("UPDATE harvest_runs SET records_held = %s WHERE partner_id = %s AND run_id = %s",
                 (held, partner_id, run_id))
    return held
