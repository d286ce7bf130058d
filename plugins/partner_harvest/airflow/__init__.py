"""The only part of the library that knows Airflow: connections, cursors, tasks, DAGs."""
