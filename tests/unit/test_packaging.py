"""pyproject.toml: what the installed package declares matches what its code needs.

(`scripts/check_install.sh` installs it for real next to Airflow; this is the fast part.)
"""

from __future__ import annotations

import ast
import importlib
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "plugins" / "partner_harvest"
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]


def _name(requirement: str) -> str:
    return re.split(r"[\[<>=!~; ]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def _third_party_imports() -> set[str]:
    names: set[str] = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return {n for n in names if n not in sys.stdlib_module_names and n != "partner_harvest"}


def test_runtime_dependencies_are_ranges_not_pins() -> None:
    pinned = [r for r in PROJECT["dependencies"] if "==" in r]
    assert pinned == [], "pins belong in requirements.txt/constraints.txt; the package declares ranges"


def test_every_imported_distribution_is_declared() -> None:
    declared = {_name(r) for r in PROJECT["dependencies"]}
    owners = packages_distributions()
    undeclared = {}
    for module in _third_party_imports():
        dists = {d.lower().replace("_", "-") for d in owners.get(module, [])}
        if not dists & declared:
            undeclared[module] = sorted(dists)
    assert undeclared == {}


def test_demo_and_test_only_packages_stay_extras() -> None:
    runtime = {_name(r) for r in PROJECT["dependencies"]}
    assert not runtime & {"pgserver", "pytest", "aiosmtpd"}
    assert "pgserver" in {_name(r) for r in PROJECT["optional-dependencies"]["demo"]}


def test_plugin_entry_point_names_an_airflow_plugin() -> None:
    from airflow.plugins_manager import AirflowPlugin

    target = PROJECT["entry-points"]["airflow.plugins"]["partner_harvest"]
    module, _, attr = target.partition(":")
    plugin = getattr(importlib.import_module(module), attr)
    assert issubclass(plugin, AirflowPlugin) and plugin.name == "partner_harvest"


def test_console_script_is_the_cli() -> None:
    module, _, attr = PROJECT["scripts"]["partner-harvest"].partition(":")
    assert callable(getattr(importlib.import_module(module), attr))


def test_migrations_ship_as_package_data() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    patterns = config["package-data"]["partner_harvest.store"]
    shipped = {p for pattern in patterns for p in (PACKAGE / "store").glob(pattern)}
    assert shipped == set((PACKAGE / "store" / "migrations").glob("*.sql")) != set()


def test_the_tested_pins_lie_inside_the_declared_ranges() -> None:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    pins = {}
    for line in (ROOT / "constraints.txt").read_text(encoding="utf-8").splitlines():
        if "==" in line and not line.startswith("#"):
            name, _, version = line.partition("==")
            pins[canonicalize_name(name)] = version.strip()
    outside = {}
    for text in PROJECT["dependencies"]:
        requirement = Requirement(text)
        pinned = pins.get(canonicalize_name(requirement.name))
        assert pinned, f"{requirement.name} is not in constraints.txt: the tested set must cover it"
        if not requirement.specifier.contains(pinned, prereleases=True):
            outside[requirement.name] = (pinned, str(requirement.specifier))
    assert outside == {}


def test_installed_package_finds_the_registry_under_airflow_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from partner_harvest import registry

    monkeypatch.delenv("HARVEST_PARTNERS_FILE", raising=False)
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    assert registry.partners_file() == registry.DEFAULT_PARTNERS_FILE  # running from the repository
    monkeypatch.setattr(registry, "DEFAULT_PARTNERS_FILE", tmp_path / "site-packages" / "include" / "partners.yaml")
    assert registry.partners_file() == tmp_path / "include" / "partners.yaml"
    monkeypatch.setenv("HARVEST_PARTNERS_FILE", "/etc/harvest/partners.yaml")
    assert str(registry.partners_file()) == "/etc/harvest/partners.yaml"


def test_every_package_of_the_library_is_in_the_wheel() -> None:
    """Regression: ``sierra/`` had no ``__init__.py``, so the package discovery pyproject.toml
    configures (``[tool.setuptools.packages.find]``, not namespace packages) left the Sierra
    protocol out of a built wheel; an editable install hid it."""
    from setuptools import find_packages

    found = set(find_packages(str(ROOT / "plugins"), include=["partner_harvest*"]))
    folders = {".".join(path.parent.relative_to(ROOT / "plugins").parts) for path in PACKAGE.rglob("*.py")
               if "__pycache__" not in path.parts}
    assert folders - found == set()


def test_one_door_per_job_no_module_of_the_package_runs_as_a_script() -> None:
    """Commands are `partner-harvest` subcommands and generated files come from
    scripts/gen_docs.py: no module of the package is a second entry point of its own
    (`python -m partner_harvest.cli` is the command line itself)."""
    doors = sorted(str(path.relative_to(PACKAGE)) for path in PACKAGE.rglob("*.py")
                   if '__name__ == "__main__"' in path.read_text(encoding="utf-8") or path.name == "__main__.py")
    assert doors == ["cli/__main__.py"]
