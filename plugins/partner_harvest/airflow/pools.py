"""Create or update one Airflow pool per registry partner (``partner_<id>``).

The tasks that send requests to a partner run in its pool, so its ``pool_slots`` (default
1) bound the concurrent requests to that endpoint across the harvest DAG, the reconcile
DAG and backfills. Airflow does not schedule a task whose pool does not exist: run this
after every registry change (it is idempotent)::

    python -m partner_harvest.airflow.pools          # PYTHONPATH=plugins, AIRFLOW_HOME set
"""

from __future__ import annotations

import sys

from partner_harvest.registry import Partner, load_partners


def pool_specs(partners: list[Partner]) -> list[tuple[str, int, str]]:
    return [
        (p.pool, p.pool_slots, f"Concurrent requests to partner {p.id} ({p.protocol}, Connection {p.conn_id})")
        for p in partners
    ]


def sync_pools() -> list[tuple[str, int, str]]:
    from airflow.models.pool import Pool

    specs = pool_specs(load_partners())
    for name, slots, description in specs:
        Pool.create_or_update_pool(name, slots, description, include_deferred=False)
    return specs


def main() -> int:
    for name, slots, _ in sync_pools():
        print(f"pool {name}: {slots} slot(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
