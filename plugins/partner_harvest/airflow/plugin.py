"""The project's Airflow plugin: the partner health pages, in the UI's navigation.

Airflow finds it through the installed package's ``airflow.plugins`` entry point, never
through the plugins folder: Airflow's folder loader imports every ``.py`` file under that
folder as a top-level module named after the file, so a plugins folder holding these
sources would load each library module twice and register the plugin twice. The plugin
refuses to load in such a deployment, with a message saying what to change.
"""

from __future__ import annotations

from pathlib import Path

from airflow.plugins_manager import AirflowPlugin

import partner_harvest
from partner_harvest.airflow.health.app import URL_PREFIX, app

SOURCES = Path(partner_harvest.__file__).resolve().parent


class PluginsFolderHoldsSources(RuntimeError):
    """Airflow's plugins folder contains the partner_harvest sources (a copied ``plugins/``)."""


def refuse_plugins_folder_with_sources(plugins_folder: str | None) -> None:
    """Raise when the library's own files lie under ``plugins_folder``."""
    if not plugins_folder:
        return
    folder = Path(plugins_folder).expanduser().resolve()
    if SOURCES.is_relative_to(folder):
        raise PluginsFolderHoldsSources(
            f"partner_harvest: Airflow's plugins_folder {folder} holds the library's sources ({SOURCES}); "
            "Airflow would import each of its modules a second time as a top-level module. Install the "
            "package (pip install partner-harvest; its entry point registers this plugin) and point "
            "[core] plugins_folder at a folder without it (Airflow's default $AIRFLOW_HOME/plugins)")


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

    @classmethod
    def on_load(cls, *args: object, **kwargs: object) -> None:
        from airflow.sdk import conf

        refuse_plugins_folder_with_sources(conf.get("core", "plugins_folder", fallback=None))
        from partner_harvest.airflow import preload  # forked task and parse processes inherit the library

        preload.register()
