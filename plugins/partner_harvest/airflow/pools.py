"""Create or update one Airflow pool per registry partner (``partner_<id>``), or check them.

The tasks that send requests to a partner run in its pool, so its ``pool_slots`` (default
1) bound the concurrent requests to that endpoint across the harvest DAG, the reconcile
DAG and backfills. Airflow never schedules a task whose pool does not exist, and says so
only in the scheduler's log (3.3.2 raises no DAG warning for it): run this after every
registry change (it is idempotent), and ``--check`` in deployment checks::

    python -m partner_harvest.airflow.pools           # create/update; PYTHONPATH=plugins, AIRFLOW_HOME set
    python -m partner_harvest.airflow.pools --check   # exit 1, naming them, when pools are missing

A run that waits anyway is reported by its run deadline (registry ``run_deadline``).
"""

from __future__ import annotations

import argparse
import sys

from partner_harvest.registry import Partner, Registry, load_registry


def pool_specs(partners: list[Partner]) -> list[tuple[str, int, str]]:
    return [
        (p.pool, p.pool_slots, f"Concurrent requests to partner {p.id} ({p.protocol}, Connection {p.conn_id})")
        for p in partners
    ]


def sync_pools(registry: Registry | None = None) -> list[tuple[str, int, str]]:
    """Create/update the pools of the valid partners (an invalid entry has no DAG to run)."""
    from airflow.models.pool import Pool

    registry = registry or load_registry()
    specs = pool_specs(registry.partners)
    for name, slots, description in specs:
        Pool.create_or_update_pool(name, slots, description, include_deferred=False)
    return specs


def missing_pools(registry: Registry | None = None) -> list[tuple[str, str]]:
    """(pool, partner id) of every valid partner whose pool does not exist."""
    from airflow.models.pool import Pool

    registry = registry or load_registry()
    existing = {pool.pool for pool in Pool.get_pools()}
    return [(p.pool, p.id) for p in registry.partners if p.pool not in existing]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m partner_harvest.airflow.pools", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="only report missing pools (exit 1 if any)")
    args = parser.parse_args(argv)
    registry = load_registry()
    status = 0
    for error in registry.errors:
        print(f"invalid registry entry (no pool, no DAG): {error}", file=sys.stderr)
        status = 1
    if args.check:
        for pool, partner_id in missing_pools(registry):
            print(f"pool {pool} is missing: the tasks of partner {partner_id} will never be scheduled",
                  file=sys.stderr)
            status = 1
        return status
    for name, slots, _ in sync_pools(registry):
        print(f"pool {name}: {slots} slot(s)")
    return status


if __name__ == "__main__":
    sys.exit(main())
