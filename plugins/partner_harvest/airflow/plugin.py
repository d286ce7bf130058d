"""The project's Airflow plugin: the partner health pages, in the UI's navigation.

One ``AirflowPlugin`` subclass for both ways Airflow finds plugins: the ``airflow.plugins``
entry point of the installed package, and ``plugins/partner_harvest_plugin.py`` (the
plugins folder's loader skips ``partner_harvest/``, see plugins/.airflowignore).
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from partner_harvest.airflow.health.app import URL_PREFIX, app


class PartnerHarvestPlugin(AirflowPlugin):
    name = "partner_harvest"
    fastapi_apps = [{"app": app, "url_prefix": URL_PREFIX, "name": "Partner health"}]
    external_views = [{
        "name": "Partner health",
        "href": URL_PREFIX.lstrip("/") + "/",  # relative to the UI's base URL
        "destination": "nav",
        "category": "browse",
        "url_route": "partner-health",
    }]
