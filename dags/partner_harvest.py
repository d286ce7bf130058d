"""One harvest DAG per partner in the registry (include/partners.yaml): harvest_<id>."""

from airflow.sdk import get_parsing_context

from partner_harvest.airflow.dag_factory import build_harvest_dag
from partner_harvest.registry import load_partners

_wanted = get_parsing_context().dag_id
for _partner in load_partners():
    if _wanted is None or _wanted == _partner.dag_id:
        build_harvest_dag(_partner)
