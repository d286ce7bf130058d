"""The Airflow plugin of partner harvest, registered through the ``airflow.plugins`` entry
point of the installed package (pyproject.toml), so a deployment's plugins folder may be
empty. It holds no DAGs: those are the files in ``dags/``. Extended with the UI page."""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin


class PartnerHarvestPlugin(AirflowPlugin):
    """Registers partner harvest with Airflow (``airflow plugins`` lists it)."""

    name = "partner_harvest"
