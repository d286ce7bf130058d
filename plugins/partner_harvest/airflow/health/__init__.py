"""Partner health in the Airflow UI: a FastAPI app (``app``) and its SVG chart; SQL lives in
``partner_harvest.store.health``."""
