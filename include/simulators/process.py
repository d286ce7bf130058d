"""Running a simulator as its own process, and talking to its /_control API.

The demo and the benchmarks use this: a separate process keeps the harvester's own
memory and CPU figures clean, as a real partner would be.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


@contextmanager
def simulator_process(module: str, *args: str) -> Iterator[str]:
    """Start ``python -m include.simulators.<module> ... --port 0``; yields its base URL."""
    cmd = [sys.executable, "-m", f"include.simulators.{module}", *args, "--port", "0"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline().strip() if proc.stdout else ""
        if not line.startswith("listening on "):
            raise SystemExit(f"the {module} simulator did not start: {line!r}")
        yield line.removeprefix("listening on ")
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def control(url: str, action: str, body: dict[str, Any] | None = None) -> Any:
    """POST (with a body) or GET (without) ``/_control/<action>``: the answer's JSON, or for
    ``live_ids`` and ``public_ids`` the set of identifiers."""
    base = url.split("/iii/")[0] if "/iii/" in url else url.rsplit("/", 1)[0]
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"{base}/_control/{action}", data=data,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as response:
        payload = response.read().decode()
    return set(payload.split()) if action in ("live_ids", "public_ids") else json.loads(payload)
