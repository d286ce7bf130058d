"""The metrics a run reports, defined once: their names, kinds and meaning.

The Airflow layer (``airflow/metrics.py``) sends them through Airflow's own Stats
(StatsD, Datadog or OpenTelemetry, as ``[metrics]`` configures); ``docs/operator/metrics.md``
is generated from :data:`METRICS` (``docs_gen``), so a dashboard built from that page names
what the code sends. No Airflow import here (the library's rule).

Every name ends in the partner's id (``partner_harvest.fetched.<partner_id>``), the way
Airflow's own per-DAG metrics end in the DAG id: plain StatsD has no tags, and a dashboard
selects a partner with the last segment. The partner id is also passed as the tag
``partner_id`` for the backends that keep tags.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

PREFIX = "partner_harvest"
Kind = Literal["counter", "gauge", "timer"]


@dataclass(frozen=True)
class Metric:
    key: str
    kind: Kind
    unit: str
    meaning: str
    sent_by: str  # the task that sends it

    def name(self, partner_id: str) -> str:
        return f"{PREFIX}.{self.key}.{partner_id}"


_APPLY = "apply_changes (once per applied run: the sum over its channels and slices)"
_TRAFFIC = "every task that talks to the partner (freeze_window, plan_slices, harvest_changes, poll_deletions, reconcile)"

METRICS: tuple[Metric, ...] = (
    Metric("fetched", "counter", "items", "items fetched and staged by the run (records, deletions, rejects)", _APPLY),
    Metric("upserted", "counter", "records", "records inserted or replaced by a newer version", _APPLY),
    Metric("unchanged", "counter", "items", "items that changed nothing (versions already held, older versions, "
           "deletions of records never held)", _APPLY),
    Metric("purged", "counter", "records", "records removed (each also a deletions row); the reconcile's removals "
           "count here too", f"{_APPLY}; reconcile"),
    Metric("quarantined", "counter", "records", "records rejected into quarantine", _APPLY),
    Metric("warnings", "counter", "records", "records that landed with at least one validation warning "
           "(per check, summed)", _APPLY),
    Metric("runs_applied", "counter", "runs", "applied runs (harvests and reconciles); a run that fails sends none",
           f"{_APPLY}; reconcile"),
    Metric("requests", "counter", "responses", "HTTP responses received from the partner (a redirect counts, a "
           "transport retry inside one request does not)", _TRAFFIC),
    Metric("response_bytes", "counter", "bytes", "decoded body bytes received from the partner", _TRAFFIC),
    Metric("run_seconds", "timer", "milliseconds", "from the start of the DAG run to the end of its apply",
           "apply_changes"),
    Metric("cursor_lag_seconds", "gauge", "seconds", "how far the partner's cursor is behind our clock right "
           "after the run moved it (the age of the newest change we are sure to hold)", "advance_cursor"),
)

BY_KEY: dict[str, Metric] = {m.key: m for m in METRICS}
APPLY_COUNTS = ("fetched", "upserted", "unchanged", "purged", "quarantined")


def metric(key: str) -> Metric:
    """The metric named ``key``; KeyError for a name the docs would not list."""
    return BY_KEY[key]


def markdown_table() -> str:
    lines = ["| name | kind | unit | meaning | sent by |", "|---|---|---|---|---|"]
    for m in METRICS:
        lines.append(f"| `{m.name('<partner_id>')}` | {m.kind} | {m.unit} | {m.meaning} | {m.sent_by} |")
    return "\n".join(lines)
