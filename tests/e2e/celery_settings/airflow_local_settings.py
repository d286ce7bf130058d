"""Airflow local settings of the Celery e2e stack only (its services get this folder on PYTHONPATH).

A cluster policy, as an operator would write one: retries wait one second instead of the
DAGs' two minutes with backoff, so a retry after a killed worker shows up in seconds.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any


def task_policy(task: Any) -> None:
    task.retry_delay = timedelta(seconds=1)
    task.retry_exponential_backoff = 0
