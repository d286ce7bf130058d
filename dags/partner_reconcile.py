"""One weekly full-reconcile DAG per partner in the registry: reconcile_<id>.

An invalid entry gets an error DAG of the same name instead; the others are unaffected.
"""

from airflow.sdk import get_parsing_context

from partner_harvest.airflow.dag_factory import build_dags

build_dags("reconcile", get_parsing_context().dag_id)
