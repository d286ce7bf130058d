"""Example downstream DAG: partners' changes as JSON Lines, scheduled on their Asset events.

The contract it relies on is in docs/consumers.md ("Asset events and the change
feed"); the logic is in plugins/partner_harvest/feed.py and airflow/downstream.py.
"""

from partner_harvest.airflow.downstream import build_jsonl_export_dag

dag = build_jsonl_export_dag()
