"""airflow.cfg.example names only settings Airflow 3.3 knows, and its idle settings keep what
the deployment relies on (docs/operator/many-partners.md, "The idle hours").

A misspelt key is silently ignored by Airflow: the deployment would run on the default and
pay for it all day (or lose a guarantee the comment next to it promises).
"""

from __future__ import annotations

import configparser
from pathlib import Path

import pytest
from airflow.configuration import conf

EXAMPLE = Path(__file__).resolve().parents[2] / "airflow.cfg.example"


def example() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None)
    parser.read(EXAMPLE, encoding="utf-8")
    return parser


def effective(section: str, key: str) -> float:
    """The example's value, else Airflow's default: what a deployment from the example runs with."""
    parser = example()
    if parser.has_option(section, key):
        return float(parser.get(section, key))
    default = conf.get_default_value(section, key)
    assert default is not None, f"[{section}] {key} has no Airflow default"
    return float(default)


def test_every_key_of_the_example_is_an_airflow_setting() -> None:
    parser = example()
    unknown = [f"[{section}] {key}" for section in parser.sections() for key in parser.options(section)
               if key not in conf.configuration_description.get(section, {}).get("options", {})]
    assert parser.sections() and not unknown


@pytest.mark.parametrize(("section", "key", "limit"), [
    ("scheduler", "scheduler_idle_sleep_time", 5),         # a run or a freed slot waits at most this
    ("scheduler", "trigger_timeout_check_interval", 60),   # approval timeouts are noticed within a minute
    ("scheduler", "task_instance_heartbeat_timeout", 300),  # a dead task is failed within minutes...
    ("scheduler", "task_instance_heartbeat_timeout_detection_interval", 10),  # ...looked for this often
    ("scheduler", "task_queued_timeout", 600),
    ("dag_processor", "bundle_refresh_check_interval", 60),
])
def test_the_idle_settings_keep_the_reaction_times(section: str, key: str, limit: float) -> None:
    assert 0 < effective(section, key) <= limit


@pytest.mark.parametrize(("heartbeat", "threshold"), [
    (("scheduler", "scheduler_heartbeat_sec"), ("scheduler", "scheduler_health_check_threshold")),
    (("scheduler", "job_heartbeat_sec"), ("dag_processor", "health_check_threshold")),  # the dag-processor's
])
def test_the_heartbeats_stay_well_inside_the_health_thresholds(heartbeat: tuple[str, str],
                                                                threshold: tuple[str, str]) -> None:
    # Three heartbeats per threshold: one late heartbeat on a loaded machine is not "unhealthy".
    assert effective(*heartbeat) * 3 <= effective(*threshold)


def test_the_idle_settings_are_set_not_left_to_airflow() -> None:
    parser = example()
    for section, key in [("scheduler", "scheduler_idle_sleep_time"), ("scheduler", "parsing_cleanup_interval"),
                         ("dag_processor", "bundle_refresh_check_interval"),
                         ("dag_processor", "min_file_process_interval")]:
        assert parser.has_option(section, key), f"[{section}] {key}"
        assert float(parser.get(section, key)) > float(conf.get_default_value(section, key)), f"[{section}] {key}"
