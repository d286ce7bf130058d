"""What an approval request shows: links that resolve (the Airflow UI's, and the docs only from
``[partner_harvest] docs_url``: the relative ``docs/operator/approvals.md`` opened Airflow's 404
page), its timeout as a person reads it (not ``2 days, 0:00:00``), and the "not returned by this
full harvest" row only for a full harvest."""

from __future__ import annotations

from datetime import datetime, timezone
from types import SimpleNamespace

import pytest

from partner_harvest import gates
from partner_harvest.store.gates import Request
from tests.support.partners import oai_partner

REQUEST = Request("museum", "harvest_museum/manual__1", "harvest_museum", gates.SHRINK, 200, 40, 0, 0.1, [], None,
                  datetime(2026, 1, 1, tzinfo=timezone.utc), "pending")
CONTEXT = {"ti": SimpleNamespace(dag_id="harvest_museum", run_id="manual__1", task_id="approval_gate")}


def test_the_links_resolve_and_the_docs_link_needs_docs_url(monkeypatch: pytest.MonkeyPatch) -> None:
    from partner_harvest.airflow.gates import PartnerApprovalGate

    monkeypatch.setenv("AIRFLOW__API__BASE_URL", "https://airflow.example")
    monkeypatch.delenv("AIRFLOW__PARTNER_HARVEST__DOCS_URL", raising=False)
    links = PartnerApprovalGate._links(CONTEXT, oai_partner("museum"))  # type: ignore[arg-type]
    assert links == {
        "Required action": "https://airflow.example/dags/harvest_museum/runs/manual__1/tasks/approval_gate/required_actions",
        "This run": "https://airflow.example/dags/harvest_museum/runs/manual__1",
        "Partner health": "https://airflow.example/partner-health/partner/museum",
    }
    monkeypatch.setenv("AIRFLOW__PARTNER_HARVEST__DOCS_URL", "https://git.example/harvest/blob/main/docs/")
    links = PartnerApprovalGate._links(CONTEXT, oai_partner("museum"))  # type: ignore[arg-type]
    assert links["What to check"] == "https://git.example/harvest/blob/main/docs/operator/approvals.md"


def test_the_request_reads_its_timeout_humanly_and_counts_absent_records_only_for_a_full_harvest() -> None:
    partner = oai_partner("museum")
    note = gates.timeout_note(partner)
    assert note == "No answer within `approval_timeout` (2d): then it alerts and keeps waiting."
    incremental = gates.body(REQUEST, partner, {}, note)
    assert "not returned by this full harvest" not in incremental and "| purged by the apply (tombstones) | 40 |" in incremental
    assert "not returned by this full harvest" in gates.body(REQUEST, partner, {}, note, whole_collection=True)
