"""Figure 4: the package installs next to a plain Airflow without changing it (slow:
a fresh virtualenv, ~1.5 minutes with a warm pip cache; set HARVEST_CHECK_INSTALL=1)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.skipif(not os.environ.get("HARVEST_CHECK_INSTALL"), reason="set HARVEST_CHECK_INSTALL=1 (needs PyPI)")
def test_package_installs_into_a_plain_airflow() -> None:
    done = subprocess.run(["bash", str(ROOT / "scripts" / "check_install.sh")], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "none of the" in done.stdout and "all valid" in done.stdout
