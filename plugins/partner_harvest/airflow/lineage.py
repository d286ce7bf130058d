"""Hook-level lineage: what a task read from the partner and wrote to the aggregation.

Reported to Airflow's hook lineage collector (``airflow.sdk.lineage``), which the
OpenLineage provider (``apache-airflow-providers-openlineage``) reads when a task ends and
turns into the task's OpenLineage inputs and outputs. Without a lineage reader (no
OpenLineage configured) the collector is Airflow's no-op one and this costs nothing.

The assets use schemes of this package, declared with their converters in the provider
info (``provider.py``: ``asset-uris``), so OpenLineage names them by its own conventions:

- the partner's endpoint, ``oai-pmh+https://host:port/path`` or ``sierra+https://...``,
  becomes the dataset ``namespace = https://host:port``, ``name = /path`` (credentials,
  query and fragment never part of it);
- an aggregation table, ``partner-harvest+postgres://host:port/database/schema/table``,
  becomes ``namespace = postgres://host:port``, ``name = database.schema.table``, the
  naming every PostgreSQL integration of OpenLineage uses, so the tables join the graphs
  of the jobs that read them.
"""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import quote, unquote, urlsplit

from partner_harvest import protocols

log = logging.getLogger(__name__)

# Every protocol (a new one needs nothing here): its name is the scheme.
ENDPOINT_SCHEMES = tuple(f"{spec.name}+{scheme}" for spec in protocols.specs() for scheme in spec.schemes)
TABLE_SCHEME = "partner-harvest+postgres"
STAGING = ("staging",)
APPLIED = ("records", "deletions", "quarantine")


def endpoint_uri(protocol: str, base_url: str) -> str:
    """The partner's endpoint as an asset URI: no user info, no query."""
    parts = urlsplit(base_url)
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    return f"{protocols.spec_of(protocol).name}+{parts.scheme.lower()}://{host}{port}{parts.path or '/'}"


def table_uri(host: str | None, port: int | None, database: str, schema: str, table: str) -> str:
    """An aggregation table; a socket-directory host is percent-encoded into one segment."""
    netloc = quote(host or "localhost", safe="") + f":{port or 5432}"
    return f"{TABLE_SCHEME}://{netloc}/{database}/{schema}/{table}"


# -- the provider's asset-uris entries (provider.py) ----------------------------------------

def normalize(parts: Any) -> Any:
    """Asset URI handler: lower-case scheme and host (Airflow's AIP-60 normalisation)."""
    return parts._replace(scheme=parts.scheme.lower(), netloc=parts.netloc.lower(), query="", fragment="")


def to_openlineage(asset: Any, lineage_context: Any = None) -> Any:
    """Asset converter: one of our asset URIs as an OpenLineage ``Dataset``."""
    from openlineage.client.event_v2 import Dataset

    parts = urlsplit(asset.uri)
    if parts.scheme == TABLE_SCHEME:
        database, schema, table = [unquote(p) for p in parts.path.strip("/").split("/")]
        return Dataset(namespace=f"postgres://{parts.netloc}", name=f"{database}.{schema}.{table}")
    _, _, transport = parts.scheme.partition("+")
    return Dataset(namespace=f"{transport}://{parts.netloc}", name=parts.path or "/")


# -- reporting ----------------------------------------------------------------------------------

def _collector() -> Any:
    from airflow.sdk.lineage import get_hook_lineage_collector

    return get_hook_lineage_collector()


def read_endpoint(hook: Any, protocol: str, base_url: str) -> None:
    """The task read the partner's endpoint (through ``hook``)."""
    _report("input", hook, [endpoint_uri(protocol, base_url)])


def tables(conn: Any, names: tuple[str, ...]) -> list[str]:
    """Asset URIs of aggregation tables, located by the connection itself ([] if it cannot say)."""
    try:
        database, schema = conn.execute("SELECT current_database(), current_schema()").fetchone()
        conn.commit()
    except Exception as exc:  # lineage never fails a harvest
        conn.rollback()
        log.warning("lineage: the aggregation's tables not reported: %s", exc)
        return []
    return [table_uri(conn.info.host, conn.info.port, database, schema, name) for name in names]


def wrote(hook: Any, uris: list[str]) -> None:
    _report("output", hook, uris)


def read(hook: Any, uris: list[str]) -> None:
    _report("input", hook, uris)


def _report(direction: str, hook: Any, uris: list[str]) -> None:
    try:
        collector = _collector()
        add = collector.add_input_asset if direction == "input" else collector.add_output_asset
        for uri in uris:
            add(hook, uri=uri)
    except Exception as exc:  # lineage never fails a harvest
        log.warning("lineage not reported (%s): %s", ", ".join(uris), exc)
