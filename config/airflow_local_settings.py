"""Airflow local settings for a deployment of partner harvest.

Copy this file to ``$AIRFLOW_HOME/config/airflow_local_settings.py`` on every Airflow
machine (the official image: ``/opt/airflow/config/``), or add its two lines to the
``airflow_local_settings.py`` you already have. Every Airflow process imports it at start,
the scheduler included, which never imports a DAG file.

It makes Airflow 3.3.2 recognise a busy row lock under psycopg 3 (the driver of
``airflow.cfg.example``): without it the scheduler exits with ``LockNotAvailable`` where it
should skip one loop (``partner_harvest/airflow/compat.py``). It does nothing on an
Airflow release that recognises the lock itself.
"""

from partner_harvest.airflow.compat import recognise_psycopg3_lock_errors

__all__: list[str] = []  # no settings or policies from here: Airflow copies every listed name

recognise_psycopg3_lock_errors()
