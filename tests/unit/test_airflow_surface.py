"""docs/design/airflow-surface.md lists every non-public Airflow import of the code, and
nothing more: a new one needs its line (why, when it can go), a removed one loses it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "design" / "airflow-surface.md"
# Airflow's public surface for this code: the Task SDK, the providers, the plugin and listener interfaces.
PUBLIC = ("airflow.sdk", "airflow.sdk.exceptions", "airflow.plugins_manager", "airflow.listeners")


def public(module: str) -> bool:
    return module in PUBLIC or module.startswith("airflow.providers.")


def non_public_imports() -> set[tuple[str, str]]:
    """(module, file) of every import of a non-public Airflow module under plugins/ and dags/."""
    found = set()
    for path in sorted([*ROOT.glob("plugins/**/*.py"), *ROOT.glob("dags/*.py")]):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            modules: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                modules = [node.module] if node.module != "airflow" else [f"airflow.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                modules = [a.name for a in node.names]
            found |= {(m, str(path.relative_to(ROOT))) for m in modules
                      if (m == "airflow" or m.startswith("airflow.")) and not public(m)}
    return found


def listed() -> set[tuple[str, str]]:
    return set(re.findall(r"^\| `(airflow[\w.]*)` \| `([\w/.]+)` \|", PAGE.read_text(encoding="utf-8"), re.MULTILINE))


def test_the_surface_page_lists_every_non_public_import_and_nothing_else() -> None:
    code, page = non_public_imports(), listed()
    assert code - page == set(), f"non-public Airflow imports missing from {PAGE.name}: {sorted(code - page)}"
    assert page - code == set(), f"{PAGE.name} lists imports the code no longer has: {sorted(page - code)}"


def test_the_counter_sees_an_import_inside_a_function() -> None:
    tree = ast.parse("def f():\n    from airflow.models.pool import Pool\n    from airflow.sdk import DAG\n")
    modules = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]
    assert [m for m in modules if not public(m)] == ["airflow.models.pool"]
