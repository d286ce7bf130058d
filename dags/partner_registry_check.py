"""Import error (Airflow UI: "Dag Import Errors") listing each invalid registry entry.

It lives in a file of its own: an import error of the DAG files would stop every
partner's DAGs (Airflow marks all DAGs of a file with import errors as stale). Builds no
DAG (the word is here so Airflow's parser does not skip the file).
"""

from partner_harvest.airflow.dag_factory import raise_registry_problems

raise_registry_problems()
