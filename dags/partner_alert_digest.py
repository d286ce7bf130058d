"""The failure digests of outages shared by many partners (docs/operator/alerts.md):
one small DAG that sends each digest once its fold window has ended."""

from partner_harvest.airflow.alert_digest import build_digest_dag

dag = build_digest_dag()
