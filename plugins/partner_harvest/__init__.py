"""Partner harvest: the plain-Python library behind the harvest and reconcile DAGs."""
