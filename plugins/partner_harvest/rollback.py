"""A rollback as an operator asks for it, from the command line or the health page (no Airflow here).

The store restores the records in one fenced transaction (store/history.py); around it,
what lives in Airflow: the partner's DAGs are paused first (no new run starts; a run in
flight fails at its next write, fenced by the rollback's epoch bump), and its cursor
Variables are set back, inside that transaction, to where they were before the run undone.
The operator resumes the DAGs once the partner has fixed its data; the next run harvests
from the restored cursor. The command line and the page hand in their way to Airflow
(:class:`AirflowSide`): the REST API or the api-server's own models.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import psycopg

from partner_harvest.registry import Partner, cursor_key, cursor_value
from partner_harvest.store import history

WRITER = "partner-harvest rollback"


class AirflowSide(Protocol):
    """What a rollback needs of Airflow: the cursor Variables and pausing DAGs."""

    def read_variable(self, key: str) -> Any | None: ...

    def write_variable(self, key: str, value: dict[str, Any], description: str) -> None: ...

    def delete_variable(self, key: str) -> bool: ...

    def pause_dags(self, dag_ids: list[str]) -> list[str]: ...


@dataclass(frozen=True)
class Done:
    result: history.RollbackResult
    paused: list[str]

    def lines(self) -> list[str]:
        r = self.result
        out = [f"rolled back {r.plan.partner_id} to before run {r.plan.run_id} (rollback {r.id}): "
               f"{r.plan.restore} records restored, {r.plan.remove} removed; change feed "
               f"{r.change_seq_after} < change_seq <= {r.change_seq_until}"]
        for key, move in sorted(r.cursors.items()):
            out.append(f"  {key}: {move['from'] or 'unset'} -> {move['to'] or 'deleted (the next run harvests everything)'}")
        out.append(f"  DAGs paused: {', '.join(self.paused) or 'none were unpaused'}. Unpause them once the partner "
                   "has fixed its data: the next run harvests from the restored cursor.")
        return out


def dag_ids(partner: Partner) -> list[str]:
    return [partner.dag_id, partner.reconcile_dag_id]


def roll_back(conn: psycopg.Connection, partner: Partner, to_before: str, airflow: AirflowSide, *, requested_by: str,
              via: str, expected: history.RollbackPlan | None = None) -> Done:
    """Pause the partner's DAGs, then restore its records and set its cursors back (one fenced
    transaction, store/history.rollback); ``expected``: the plan the person confirmed."""
    paused = airflow.pause_dags(dag_ids(partner))

    def set_cursors(places: dict[str, history.CursorPlace]) -> dict[str, Any]:
        done: dict[str, Any] = {}
        for channel, place in places.items():
            key = cursor_key(partner.id, None if channel == "changes" else channel)
            before = airflow.read_variable(key)
            shown = before.get("until") if isinstance(before, dict) else before
            if place is None:
                airflow.delete_variable(key)
            else:
                airflow.write_variable(key, cursor_value(place[0], place[1], f"{WRITER} ({requested_by})"),
                                       description=f"harvest cursor of partner {partner.id}")
            done[key] = {"from": shown, "to": place[0].isoformat() if place else None}
        return done

    result = history.rollback(conn, partner.id, to_before, requested_by, via, set_cursors, expected)
    return Done(result, paused)
