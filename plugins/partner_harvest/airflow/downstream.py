"""The example downstream DAG: each partner's changes as JSON Lines, on its Asset events.

Scheduled on every registry partner's Asset (any of them): a run exports, for each
partner whose event triggered it (every partner when triggered by hand), the changes
since this consumer's position, with ``partner_harvest.feed.export_jsonl``. Several
events coalesced into one run cost nothing: the position, not the event, says what is
new. The position lives in the aggregation database (``feed_positions``) next to the data
it points into, so a backup restores both together and its moves are transactional; a
Variable could say "exported up to 900" of a database restored to 700.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from airflow.sdk import DAG, AssetAny, Param, Variable, get_current_context, task
from airflow.sdk.exceptions import AirflowFailException

from partner_harvest.airflow.assets import partner_asset, partner_of
from partner_harvest.airflow.dag_factory import START_DATE
from partner_harvest.airflow.tasks import aggregation
from partner_harvest.feed import export_jsonl
from partner_harvest.registry import RegistryError, load_registry
from partner_harvest.store import ensure_schema, feed

log = logging.getLogger(__name__)

DAG_ID = "example_downstream_jsonl"
CONSUMER = DAG_ID  # the key of this consumer's positions in feed_positions
DIR_VARIABLE = "partner_feed_jsonl_dir"


def export_dir(params: dict[str, Any]) -> Path:
    """Param ``output_dir``, else Variable ``partner_feed_jsonl_dir``, else $AIRFLOW_HOME/exports/jsonl."""
    chosen = params.get("output_dir") or Variable.get(DIR_VARIABLE, default=None)
    if chosen:
        return Path(chosen)
    home = os.environ.get("AIRFLOW_HOME") or os.path.expanduser("~/airflow")
    return Path(home) / "exports" / "jsonl"


def triggering_ranges(context: Mapping[str, Any]) -> dict[str, int]:
    """Per partner, the greatest ``change_seq_until`` among the events that triggered the run."""
    ranges: dict[str, int] = {}
    events = context.get("triggering_asset_events") or {}
    for asset, asset_events in events.items():
        partner_id = partner_of(getattr(asset, "uri", "") or "")
        if partner_id is None:
            continue
        for event in asset_events:
            until = int((event.extra or {}).get("change_seq_until") or 0)
            ranges[partner_id] = max(ranges.get(partner_id, 0), until)
    return ranges


def export_changes(partner_ids: list[str], context: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Export the triggering partners' new changes; fail if one is behind its own event."""
    wanted = triggering_ranges(context)
    partners = sorted(wanted) if wanted else sorted(partner_ids)
    directory = export_dir(context.get("params") or {})
    done: list[dict[str, Any]] = []
    with aggregation() as conn:
        ensure_schema(conn)
        for partner_id in partners:
            while (exported := export_jsonl(conn, CONSUMER, partner_id, directory)) is not None:
                log.info("%s: exported changes (%d, %d]: %d upserts, %d deletes to %s%s", partner_id,
                         exported.after, exported.until, exported.upserts, exported.deletes, exported.path,
                         " (an interrupted export, again)" if exported.resumed else "")
                done.append(exported.as_dict())
                if not exported.resumed:
                    break
            position = feed.position(conn, CONSUMER, partner_id)
            conn.rollback()
            if position < wanted.get(partner_id, 0):
                raise AirflowFailException(
                    f"partner '{partner_id}': the aggregation database's change feed ends at {position}, before the "
                    f"change_seq_until {wanted[partner_id]} of the Asset event that triggered this run (database "
                    "restored from a backup?); nothing after it was skipped, but check the database")
    return done


def build_jsonl_export_dag() -> DAG:
    try:
        partner_ids = [p.id for p in load_registry().partners]
        problem = ""
    except RegistryError as exc:  # the harvest DAG files show it as their import error
        partner_ids, problem = [], f" (NOT SCHEDULED: {exc})"
    schedule = AssetAny(*(partner_asset(p) for p in partner_ids)) if partner_ids else None
    with DAG(
        dag_id=DAG_ID,
        description=f"Example downstream: every partner's changes as JSON Lines, on its Asset events{problem}"[:1000],
        schedule=schedule,
        start_date=START_DATE,
        catchup=False,
        max_active_runs=1,  # one exporter per consumer (a second would only fail: FeedPositionLost)
        params={"output_dir": Param(None, type=["null", "string"],
                                    description=f"Where to write (default: Variable {DIR_VARIABLE}, "
                                    "else $AIRFLOW_HOME/exports/jsonl).")},
        default_args={"owner": "partner-harvest", "retries": 2},
        tags=["downstream", "example"],
        doc_md=__doc__,
    ) as dag:

        @task(task_id="export_changes")
        def export() -> list[dict[str, Any]]:
            return export_changes(partner_ids, get_current_context())

        export()
    return dag
