"""Every lever a benchmark pulls on the library names code that exists.

A benchmark switches code off or meters it by assigning to a module's attribute
(``apply._know_partner_rows = ...``). Assigning to a name the library renamed raises
nothing: the benchmark then measures the code switched on and reports it as off, as
``apply_statistics.py`` did for several stops. This reads every benchmark's source and
checks each such target against the module it names; and every method a benchmark's
subclass of a library class overrides (benchmarks/baselines.py: the old code paths the
library is measured against) against the class it derives from.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def imported_from_library(tree: ast.AST) -> dict[str, str]:
    """Local name -> dotted name of everything the file imports from ``partner_harvest``."""
    modules: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("partner_harvest"):
            for name in node.names:
                modules[name.asname or name.name] = f"{node.module}.{name.name}"
        elif isinstance(node, ast.Import):
            for name in node.names:
                if name.name.startswith("partner_harvest") and name.asname:
                    modules[name.asname] = name.name
    return modules


def levers(source: str) -> list[tuple[str, str, int]]:
    """(module, attribute, line) of each ``alias.attr = ...`` or ``setattr(alias, "attr", ...)``
    whose alias was imported from ``partner_harvest``, anywhere in the file."""
    tree = ast.parse(source)
    modules = imported_from_library(tree)
    found = []
    for node in ast.walk(tree):
        targets: list[tuple[ast.expr, object, int]] = []
        if isinstance(node, ast.Assign):
            targets = [(t.value, t.attr, node.lineno) for t in node.targets if isinstance(t, ast.Attribute)]
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr"
              and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)):
            targets = [(node.args[0], node.args[1].value, node.lineno)]
        for owner, attr, line in targets:
            if isinstance(owner, ast.Name) and owner.id in modules and isinstance(attr, str):
                found.append((modules[owner.id], attr, line))
    return found


def overrides(source: str) -> list[tuple[str, str, int]]:
    """(base class, method, line) of each method a class defines whose base was imported
    from ``partner_harvest``: a renamed base method would leave the override unused."""
    tree = ast.parse(source)
    imported = imported_from_library(tree)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ClassDef):
            continue
        bases = [imported[b.id] for b in node.bases if isinstance(b, ast.Name) and b.id in imported]
        for base in bases:
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and not item.name.startswith("__"):
                    found.append((base, item.name, item.lineno))
    return found


def owner_of(dotted: str) -> object:
    """The module ``dotted`` names, or the attribute of its parent module (a class, say)."""
    try:
        return importlib.import_module(dotted)
    except ModuleNotFoundError:
        parent, _, name = dotted.rpartition(".")
        return getattr(importlib.import_module(parent), name)


CASES = [(path.relative_to(BENCHMARKS).as_posix(), *lever)
         for path in sorted(BENCHMARKS.rglob("*.py")) for lever in levers(path.read_text(encoding="utf-8"))]


OVERRIDES = [(path.relative_to(BENCHMARKS).as_posix(), *override)
             for path in sorted(BENCHMARKS.rglob("*.py")) for override in overrides(path.read_text(encoding="utf-8"))]


def test_the_scan_finds_the_levers_it_guards() -> None:
    assert ("apply_statistics.py", "partner_harvest.store.apply", "_know_partner_rows") in {c[:3] for c in CASES}
    # the baselines: the sequential OAI-PMH chain, pymarc for every Sierra record
    assert ("baselines.py", "partner_harvest.sierra.marc", "decode_fast") in {c[:3] for c in CASES}
    assert ("baselines.py", "partner_harvest.oai.client.OaiClient", "_pipelined_pages") in {c[:3] for c in OVERRIDES}
    gone = "from partner_harvest.oai.client import OaiClient\nclass Old(OaiClient):\n    def _sequential_pages(self): ...\n"
    assert overrides(gone) == [("partner_harvest.oai.client.OaiClient", "_sequential_pages", 3)]
    assert not hasattr(owner_of("partner_harvest.oai.client.OaiClient"), "_sequential_pages")  # moved to baselines
    renamed = "from partner_harvest.store import apply\napply._refresh_statistics_if_outgrown = None\n"
    assert levers(renamed) == [("partner_harvest.store.apply", "_refresh_statistics_if_outgrown", 2)]
    assert not hasattr(owner_of("partner_harvest.store.apply"), "_refresh_statistics_if_outgrown")


@pytest.mark.parametrize(("benchmark", "module", "attribute", "line"), CASES,
                         ids=[f"{c[0]}:{c[3]}:{c[2]}" for c in CASES])
def test_every_benchmark_lever_names_existing_code(benchmark: str, module: str, attribute: str, line: int) -> None:
    assert hasattr(owner_of(module), attribute), (
        f"benchmarks/{benchmark}:{line} assigns {module}.{attribute}, which does not exist: the lever "
        "switches nothing (renamed?)")


@pytest.mark.parametrize(("benchmark", "base", "method", "line"), OVERRIDES,
                         ids=[f"{c[0]}:{c[3]}:{c[2]}" for c in OVERRIDES])
def test_every_baseline_override_names_an_existing_method(benchmark: str, base: str, method: str, line: int) -> None:
    assert hasattr(owner_of(base), method), (
        f"benchmarks/{benchmark}:{line} overrides {base}.{method}, which does not exist: the baseline "
        "measures the library's own code (renamed?)")
