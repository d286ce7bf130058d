"""The headless Chromium the browser tests drive (Debian's: no browser can be downloaded here)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

CHROMIUM = os.environ.get("HARVEST_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


@contextmanager
def launched_chromium() -> Iterator[Any]:
    """A headless Debian Chromium under playwright; skips without playwright, fails without the browser."""
    import pytest

    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is pinned in requirements-dev.txt")
    if not Path(CHROMIUM).exists():
        pytest.fail(f"no Chromium at {CHROMIUM}: scripts/bootstrap.sh installs Debian's chromium (apt-get)")
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield chromium
        finally:
            chromium.close()
