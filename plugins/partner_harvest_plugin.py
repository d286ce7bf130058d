"""Registers the partner_harvest Airflow plugin from the plugins folder.

Airflow imports every .py file in plugins/ as a top-level module and registers the
AirflowPlugin subclasses it finds in it; plugins/.airflowignore hides the library itself,
so this one file brings in the plugin class. When the package is installed with its
``airflow.plugins`` entry point, the entry point registers it instead (a second
registration of the same name would be reported as a plugin import error).
"""

from importlib.metadata import entry_points

_ENTRY_POINT_TARGET = "partner_harvest.airflow.plugin"

if not any(ep.value.split(":")[0] == _ENTRY_POINT_TARGET for ep in entry_points(group="airflow.plugins")):
    from partner_harvest.airflow.plugin import PartnerHarvestPlugin  # noqa: F401  (found by Airflow's loader)
