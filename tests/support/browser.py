"""The headless Chromium the browser tests drive (Debian's: no browser can be downloaded here)."""

from __future__ import annotations

import os

CHROMIUM = os.environ.get("HARVEST_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
