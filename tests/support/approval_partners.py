"""The approval-gate partners of the shared e2e stack (tests/e2e/test_approval_gates_e2e.py):
five OAI-PMH partners, one simulator each, their alerts posted to a loopback webhook.

They live beside the e2e partners in one registry, so the stack that runs them also runs
tests/e2e/test_airflow_services.py (one start of Airflow for both modules).
"""

from __future__ import annotations

import json
from contextlib import ExitStack

from include.simulators.oai_pmh import OaiSimulator, SimulatedRepository
from tests.support.airflow_stack import http_connection
from tests.support.webhook import WebhookSink

PURGE, OTHER, SHRINK, WAIT, ABANDON = "gpurge", "gother", "gshrink", "gwait", "gabandon"
PARTNERS = (PURGE, OTHER, SHRINK, WAIT, ABANDON)
# tests/e2e/test_health_index_states.py's: a shrinking harvest left waiting at its gate while the
# index is looked at (not among PARTNERS: test_approval_gates_e2e.py's first harvests leave it alone).
ASK = "gask"
EVERY = (*PARTNERS, ASK)
# approval_timeout of the two deadline partners: never reached by itself; the test moves a
# parked gate's deadline into the past once the scheduler is done with the parking.
TIMEOUT = "1h"
DAG_IDS = (*(f"harvest_{pid}" for pid in EVERY), f"reconcile_{PURGE}")


def repository(partner: str) -> SimulatedRepository:
    """The purge partner's records vanish without a trace (a reconcile finds them); the others
    keep tombstones (a harvest stages them)."""
    deleted = "no" if partner == PURGE else "persistent"
    return SimulatedRepository(records=100, page_size=50, deleted_record=deleted, deleted_fraction=0.0,
                               seed=300 + EVERY.index(partner))


def registry_lines() -> str:
    """Their entries in a registry's ``partners:`` list."""
    lines = []
    for pid in PARTNERS:
        extra = ""
        if pid in (WAIT, ABANDON):
            action = "wait" if pid == WAIT else "abandon"
            extra = f", approval_timeout: {TIMEOUT}, approval_timeout_action: {action}"
        lines.append(f"  - {{id: {pid}, protocol: oai-pmh, conn_id: partner_{pid}, metadata_prefix: oai_dc, lag: 0s,"
                     f" retries: 0, max_shrink_fraction: 0.1{extra},"
                     " options: {http: {backoff_factor: 0.01, retries: 1}}}")
    lines.append(f"  - {{id: {ASK}, protocol: oai-pmh, conn_id: partner_{ASK}, metadata_prefix: oai_dc, lag: 0s,"
                 " retries: 0, max_shrink_fraction: 0.1, options: {http: {backoff_factor: 0.01, retries: 1}}}")
    return "".join(line + "\n" for line in lines)


class ApprovalPartners:
    """The simulators and the webhook, running while the context is open."""

    repos: dict[str, tuple[SimulatedRepository, OaiSimulator]]
    alerts: WebhookSink

    def __enter__(self) -> ApprovalPartners:
        self._cleanup = ExitStack()
        try:
            self.repos = {}
            for pid in EVERY:
                repo = repository(pid)
                self.repos[pid] = (repo, self._cleanup.enter_context(OaiSimulator(repo)))
            self.alerts = WebhookSink()
            self._cleanup.callback(self.alerts.close)
        except BaseException:
            self._cleanup.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._cleanup.close()

    def overrides(self) -> dict[str, str]:
        """Their Connections, the webhook, and the scheduler's timeout sweep every second."""
        env = {f"AIRFLOW_CONN_PARTNER_{pid.upper()}": http_connection(sim.base_url) for pid, (_, sim) in self.repos.items()}
        env["AIRFLOW_CONN_HARVEST_ALERTS_WEBHOOK"] = json.dumps({"conn_type": "http", "host": self.alerts.url})
        env["AIRFLOW__SCHEDULER__TRIGGER_TIMEOUT_CHECK_INTERVAL"] = "1"
        # Five runs start at once on a shared 2-core machine: the task runners' Execution API
        # calls to the single api-server worker may take longer than the 5 s default.
        env["AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT"] = "60"
        return env
