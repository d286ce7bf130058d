"""The linter and the type checker pass on the whole tree: the library, the DAG files,
include/, the tests, the benchmarks and the scripts.

Both are configured in pyproject.toml (``[tool.ruff]``, ``[tool.mypy]``) and pinned in
requirements-dev.txt; this test runs them as a developer would, so a change that breaks
the typed contract (the registry models, the adapter base class, the window facts) fails
here and not in production.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LIBRARY = ROOT / "plugins" / "partner_harvest"
ISSUE_NUMBER = re.compile(r"\b[Ii]ssues? #?[0-9]+")


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=600)


@pytest.mark.static
def test_ruff_finds_nothing() -> None:
    result = _run("ruff", "check", "--no-cache")  # the whole tree (pyproject.toml excludes .venv and build)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.static
@pytest.mark.slow  # one to two minutes: not in the --fast edit loop, in scripts/test.sh's gate
@pytest.mark.timeout(600)  # cold (no cache, as CI runs it) on a loaded machine it outlasts the default
def test_mypy_finds_nothing() -> None:
    """``python -m mypy`` with the project's settings (files, strictness) from pyproject.toml."""
    result = _run("mypy", "--no-incremental", "--cache-dir", "/dev/null")
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]


def test_no_library_module_shadows_the_standard_library() -> None:
    """Airflow's plugin loader and ``python plugins/...`` put the library's folders on
    sys.path: a module named like a standard one (the old ``http.py``) would replace it."""
    shadowing = sorted(
        str(path.relative_to(LIBRARY)) for path in LIBRARY.rglob("*.py")
        if path.stem in sys.stdlib_module_names
    )
    assert shadowing == []


def test_no_issue_numbers_outside_the_changelog() -> None:
    """History lives in CHANGELOG.md (and the dated figures in benchmarks/RESULTS.md): code and
    docs say what is and why, not which issue brought it."""
    tracked = subprocess.run(["git", "ls-files", "*.py", "*.md", "*.sql", "*.sh", "*.yaml", "*.cfg*"], cwd=ROOT,
                             capture_output=True, text=True, check=True).stdout.split()
    exempt = {"CHANGELOG.md", "benchmarks/RESULTS.md"}
    mentions = [f"{name}:{number}" for name in tracked if name not in exempt and not name.startswith("tests/fixtures/")
                for number, line in enumerate((ROOT / name).read_text(errors="replace").splitlines(), 1)
                if ISSUE_NUMBER.search(line)]
    assert mentions == []
