"""One weekly full-reconcile DAG per partner in the registry: reconcile_<id>."""

from airflow.sdk import get_parsing_context

from partner_harvest.airflow.dag_factory import build_reconcile_dag
from partner_harvest.registry import load_partners

_wanted = get_parsing_context().dag_id
for _partner in load_partners():
    if _wanted is None or _wanted == _partner.reconcile_dag_id:
        build_reconcile_dag(_partner)
