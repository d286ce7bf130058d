"""One Airflow pool per registry partner (``partner_<id>``): what ``partner-harvest sync-pools``
creates or updates, and what ``sync-pools --check`` reports missing, through Airflow's REST API.

The tasks that send requests to a partner run in its pool, so its ``pool_slots`` (default
1) bound the concurrent requests to that endpoint across the harvest DAG, the reconcile
DAG and backfills. Airflow never schedules a task whose pool does not exist, and says so
only in the scheduler's log (3.3.2 raises no DAG warning for it). A run that waits anyway
is reported by its run deadline (registry ``run_deadline``).
"""

from __future__ import annotations

from airflow_client import client as airflow_client

from partner_harvest.airflow import api
from partner_harvest.registry import Partner, Registry


def pool_specs(partners: list[Partner]) -> list[tuple[str, int, str]]:
    return [
        (p.pool, p.pool_slots, f"Concurrent requests to partner {p.id} ({p.protocol}, Connection {p.conn_id})")
        for p in partners
    ]


def existing_pools() -> dict[str, tuple[int, str]]:
    """pool name -> (slots, description) of every pool Airflow has."""
    return {p.name: (p.slots, p.description or "") for p in api.all_pools()}


def write_pool(name: str, slots: int, description: str, exists: bool) -> None:
    with api.calling(f"{'PATCH' if exists else 'POST'} /api/v2/pools/{name}"):
        if exists:
            api.pools().patch_pool(name, airflow_client.PoolPatchBody(pool=name, slots=slots, description=description,
                                                                      include_deferred=False))
        else:
            api.pools().post_pool(airflow_client.PoolBody(name=name, slots=slots, description=description,
                                                          include_deferred=False))


def sync_pools(registry: Registry) -> list[tuple[str, int, str]]:
    """Create/update the pools of the valid partners (an invalid entry has no DAG to run);
    a pool already as the registry says is left alone."""
    have = existing_pools()
    specs = pool_specs(registry.partners)
    for name, slots, description in specs:
        if have.get(name) != (slots, description):
            write_pool(name, slots, description, exists=name in have)
    return specs


def missing_pools(registry: Registry) -> list[tuple[str, str]]:
    """(pool, partner id) of every valid partner whose pool does not exist."""
    have = existing_pools()
    return [(p.pool, p.id) for p in registry.partners if p.pool not in have]
