"""The package's installed metadata (its entry points: the provider, the plugin) for tests that
need Airflow to discover the provider from this checkout.

An environment with the package installed already (``pip install -e .`` at any commit)
carries the entry points of that install; a test of the provider needs those of the code
under test. setuptools' own ``egg_info`` writes the distribution's metadata from
pyproject.toml (no build, no network) into a directory; put first on ``PYTHONPATH`` it is
the ``partner-harvest`` distribution ``importlib.metadata`` (and so Airflow's
ProvidersManager) finds, shadowing any older install of it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def package_metadata(dest: Path) -> Path:
    """Write ``partner_harvest.egg-info`` under ``dest``; return ``dest`` (a PYTHONPATH entry)."""
    dest.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [sys.executable, "-c", "import setuptools; setuptools.setup()", "-q", "egg_info", "--egg-base", str(dest)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    if done.returncode != 0 or not (dest / "partner_harvest.egg-info" / "entry_points.txt").exists():
        raise RuntimeError(f"egg_info failed: {done.stderr[-2000:]}")
    return dest


def python_path(metadata: Path, *rest: Path) -> str:
    """PYTHONPATH with the metadata first, then this checkout's sources."""
    return os.pathsep.join([str(metadata), *(str(p) for p in rest), str(ROOT / "plugins"), str(ROOT)])
