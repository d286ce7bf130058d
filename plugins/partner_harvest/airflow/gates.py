"""The approval gate task: Airflow's ``ApprovalOperator`` in front of a risky apply.

``approval_gate`` sits between the staging tasks and the apply (harvest_<id>: after the
harvest, before ``apply_changes``; reconcile_<id>: after ``reconcile``, before
``apply_reconcile``, in a sliced reconcile too, where ``reconcile`` settles the swept
slices). Nothing over a limit: it passes at once (no query on a quiet night,
partner_harvest/gates.py) and the apply runs as before. Over a limit: it records the request
(``approval_requests``), gives the run's lease back, alerts, and parks in Airflow's
``awaiting_input`` state (Browse > Required Actions): no worker slot, no pool slot, no
triggerer, no lease. The answer resumes it in a worker:

- **Approve**: the request is marked approved and the apply runs; it applies exactly the
  staged run, fenced by the run's epoch and by "no other run of the partner applied since
  the request" (store/fences.Fence.applied_before): otherwise it refuses and writes nothing.
- **Move** (offered when records the run would purge come back under new identifiers with the
  same content, store/moves.py): approved as above, and the apply moves those records.
- **Reject**: the run is abandoned here (staging dropped, channels ``abandoned``, request
  ``rejected``); the operator skips the apply and the cursor task.
- **No answer within** ``approval_timeout``: an alert; then ``wait`` parks again without a
  deadline, ``abandon`` rejects (the HITL default option, applied by the scheduler).
"""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import quote

from airflow.providers.standard.operators.hitl import ApprovalOperator
from airflow.sdk import Context, conf
from airflow.sdk.exceptions import TaskAwaitingInput

from partner_harvest import durations, gates, protocols
from partner_harvest.airflow import tasks
from partner_harvest.airflow.notifiers import send_alert
from partner_harvest.registry import Partner, get_partner
from partner_harvest.store import ensure_schema
from partner_harvest.store import gates as store_gates
from partner_harvest.window import Window

log = logging.getLogger(__name__)
TASK_ID = "approval_gate"
DOCS = "operator/approvals.md"  # under the deployment's docs_url


def docs_url(page: str) -> str | None:
    """An absolute link to a page of the docs, from ``[partner_harvest] docs_url`` (env
    ``AIRFLOW__PARTNER_HARVEST__DOCS_URL``: where the deployment publishes docs/, e.g. the
    repository's ``.../blob/main/docs``); None without it: a relative path would open
    Airflow's 404 page."""
    base = (conf.get("partner_harvest", "docs_url", fallback="") or "").strip().rstrip("/")
    return f"{base}/{page}" if base.startswith(("http://", "https://")) else None


class PartnerApprovalGate(ApprovalOperator):
    """``kind``: ``shrink`` (a harvest's staged run) or ``purge`` (a reconcile's)."""

    def __init__(self, *, partner: Partner, kind: str, **kwargs: Any) -> None:
        abandon = partner.approval_timeout_action == "abandon"
        super().__init__(
            task_id=TASK_ID,
            subject=f"{partner.id}: approval gate",
            defaults=[self.REJECT] if abandon else None,  # the scheduler answers Reject at the deadline
            response_timeout=partner.approval_timeout,
            **kwargs,
        )
        self.partner_id = partner.id
        self.gate_kind = kind

    # -- asking ------------------------------------------------------------------------

    def execute(self, context: Context) -> Any:
        partner = get_partner(self.partner_id)
        key = tasks.run_key(context)
        request = self._request(partner, key, context)
        if request is None:  # passes at once (success, not skipped: a quiet night stays all green)
            log.info("%s: nothing crosses a limit; the apply runs without approval", partner.id)
            return None
        self.subject = gates.subject(request)
        self.body = gates.body(request, partner, self._links(context, partner), gates.timeout_note(partner),
                               whole_collection=self._whole_collection(context))
        self.options = gates.options(request)  # Move beside Approve and Reject when records would move
        tasks.release_lease(partner.id, key)  # the wait holds nothing: other work on the partner may run
        log.warning("%s: waiting for approval in Required Actions: %s", partner.id, self.subject)
        send_alert(f"[partner harvest] {partner.id}: approval needed", [
            f"Partner: {partner.id}", f"DAG: {context['dag_run'].dag_id}   run: {context['dag_run'].run_id}",
            self.subject, f"Answer in Airflow: {self._links(context, partner)['Required action']}",
        ], {"kind": "approval_requested", "partner": partner.id, "dag_id": context["dag_run"].dag_id,
            "run_id": context["dag_run"].run_id, "held": request.held, "removals": request.removals,
            "absent": request.absent})
        return super().execute(context)

    def _request(self, partner: Partner, key: str, context: Context) -> store_gates.Request | None:
        ti = context["ti"]
        dag_id = context["dag_run"].dag_id
        if self.gate_kind == gates.PURGE:
            outcome = ti.xcom_pull(task_ids="reconcile") or {}
            if not outcome.get("awaiting_approval"):
                return None
            with tasks.aggregation() as conn:
                shrink = gates.reconcile_shrink(conn, partner, key, outcome)
                return store_gates.open_request(conn, partner.id, key, dag_id, gates.PURGE, shrink,
                                                partner.max_purge_fraction, outcome.get("epoch"))
        window_data = ti.xcom_pull(task_ids="freeze_window")
        if not window_data:
            return None
        staged = ti.xcom_pull(task_ids="harvest_changes") or []
        pieces = staged if isinstance(staged, list) else [staged]
        pieces += [ti.xcom_pull(task_ids=channel.task_id) for channel in protocols.channels_for(partner)]
        window = Window.from_dict(window_data)
        tombstones = gates.staged_tombstones(pieces)
        if tombstones == 0 and not gates.covers_whole_collection(window):
            return None  # a quiet night: no connection, no query
        with tasks.aggregation() as conn:
            ensure_schema(conn)
            shrunk = gates.harvest_shrink(conn, partner, key, window, tombstones)
            if shrunk is None:
                return None
            return store_gates.open_request(conn, partner.id, key, dag_id, gates.SHRINK, shrunk,
                                            partner.max_shrink_fraction, window.protocol.epoch)

    def _whole_collection(self, context: Context) -> bool:
        """A harvest gate of a full harvest (whose records not returned it counts)."""
        if self.gate_kind != gates.SHRINK:
            return False
        window_data = context["ti"].xcom_pull(task_ids="freeze_window")
        return bool(window_data) and gates.covers_whole_collection(Window.from_dict(window_data))

    @staticmethod
    def _links(context: Context, partner: Partner) -> dict[str, str]:
        """Links that resolve: the Airflow UI's (from its root: absolute with ``[api] base_url``),
        and the docs only when the deployment says where they live (``docs_url``)."""
        from partner_harvest.airflow.health.app import URL_PREFIX  # here: a DAG file's parse needs no FastAPI

        base = (conf.get("api", "base_url", fallback="") or "").rstrip("/")
        ti = context["ti"]
        links = {
            "Required action": base + gates.required_action_path(ti.dag_id, ti.run_id, ti.task_id),
            "This run": f"{base}/dags/{quote(ti.dag_id, safe='')}/runs/{quote(ti.run_id, safe='')}",
            "Partner health": f"{base}{URL_PREFIX}/partner/{quote(partner.id, safe='')}",
        }
        docs = docs_url(DOCS)
        return {**links, "What to check": docs} if docs else links

    # -- the answer --------------------------------------------------------------------

    def execute_complete(self, context: Context, event: dict[str, Any]) -> Any:
        partner = get_partner(self.partner_id)
        key = tasks.run_key(context)
        dag_run = context["dag_run"]
        if event.get("error_type") == "timeout":  # approval_timeout_action: wait
            self._alert_timeout(partner, context, "it keeps waiting for an answer")
            raise TaskAwaitingInput(method_name="execute_complete", timeout=None)
        chosen = list(event.get("chosen_options") or [])
        by = event.get("responded_by_user")
        who = (by or {}).get("name") or (by or {}).get("id") if by else None
        if chosen == [gates.MOVE]:  # an approval whose apply moves the matched records (store/moves.py)
            with tasks.aggregation() as conn:
                store_gates.decide(conn, partner.id, key, store_gates.APPROVED, who, move=True)
            log.info("%s: run %s approved with Move by %s; the apply follows", partner.id, dag_run.run_id, who)
            return super().execute_complete(context, {**event, "chosen_options": [self.APPROVE]})
        if chosen == [self.REJECT]:
            if by is None:  # the scheduler applied the default at the deadline (abandon)
                self._alert_timeout(partner, context, "the run is abandoned")
                reason = (f"abandoned at the approval gate: no answer within {durations.human(partner.approval_timeout)} "
                          "(approval_timeout_action=abandon); nothing applied, no cursor moved")
                state = store_gates.ABANDONED
            else:
                reason = f"rejected at the approval gate by {who}; nothing applied, no cursor moved"
                state = store_gates.REJECTED
            with tasks.aggregation() as conn:
                dropped = store_gates.abandon(conn, partner.id, key, state, reason, who)
            log.warning("%s: run %s %s (%d staged rows dropped)", partner.id, dag_run.run_id, state, dropped)
        else:
            with tasks.aggregation() as conn:
                store_gates.decide(conn, partner.id, key, store_gates.APPROVED, who)
            log.info("%s: run %s approved by %s; the apply follows", partner.id, dag_run.run_id, who)
        return super().execute_complete(context, event)

    def validate_chosen_options(self, chosen_options: list[str]) -> None:
        """Move is offered only by a request whose records would move (set at ``execute``,
        after the task's own options were fixed)."""
        super().validate_chosen_options([option for option in chosen_options if option != gates.MOVE])

    def _alert_timeout(self, partner: Partner, context: Context, then: str) -> None:
        dag_run = context["dag_run"]
        send_alert(f"[partner harvest] {partner.id}: approval overdue", [
            f"Partner: {partner.id}", f"DAG: {dag_run.dag_id}   run: {dag_run.run_id}",
            f"No answer at the approval gate within {durations.human(partner.approval_timeout)}: {then}.",
            f"Answer in Airflow: {self._links(context, partner)['Required action']}",
        ], {"kind": "approval_overdue", "partner": partner.id, "dag_id": dag_run.dag_id, "run_id": dag_run.run_id,
            "action": partner.approval_timeout_action})
