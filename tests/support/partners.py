"""Test partners, built the way the DAGs build them: a registry entry through the registry.

Never ``Partner(...)`` by hand: the entry is written as a one-partner registry file and read
back with ``load_partners``, so a test partner gets the registry's defaults and checks (an
option the registry would refuse fails the test that asks for it) whatever shape the
runtime objects take.
"""

from __future__ import annotations

import tempfile
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

import yaml

from partner_harvest.adapters import Adapter
from partner_harvest.factory import Endpoint, build_adapter
from partner_harvest.registry import Partner, load_partners

# HTTP retries without waiting: a test sees a retried request in milliseconds, not seconds.
FAST_BACKOFF = {"backoff_factor": 0.01, "backoff_max": 0.05, "read_timeout": 30}
# Sierra's own 5xx retries (options.sierra), as fast. The simulated catalogues suppress a
# share of their bibs; the tests of the export and the polls hold every live bib (keep), the
# suppression tests (test_sierra_suppressed.py) ask for purge, the registry's default, or flag.
FAST_SIERRA = {"server_error_backoff": 0.01, "server_error_tries": 3, "suppressed": "keep"}
# The Sierra export in blocks small enough for a few hundred bibs, never sleeping on a 429.
SMALL_EXPORT = {"limit": 100, "rate_limit_wait": 0}

# A test partner harvests its window whole unless the test asks for slices: planning a big
# window costs count probes (requests the simulator counts) that a test of something else
# does not expect. The plan step still runs (and records "no slices").
WHOLE = {"max_slices": 1}


def fast_http(retries: int = 2, **overrides: Any) -> dict[str, Any]:
    """``options.http`` of a test partner: ``retries`` quick retries, plus any override."""
    return {**FAST_BACKOFF, "retries": retries, **overrides}


def _yaml_value(value: Any) -> Any:
    if isinstance(value, timedelta):
        return f"{int(value.total_seconds())}s"
    if isinstance(value, tuple):
        return [_yaml_value(v) for v in value]
    if isinstance(value, list):
        return [_yaml_value(v) for v in value]
    if isinstance(value, dict):
        return {k: _yaml_value(v) for k, v in value.items()}
    return value


def registry_text(*entries: dict[str, Any]) -> str:
    """A registry file holding ``entries`` (timedeltas written as seconds)."""
    return yaml.safe_dump({"partners": [_yaml_value(e) for e in entries]}, sort_keys=False)


def partner_from_entry(entry: dict[str, Any]) -> Partner:
    """The partner the registry builds from one entry (its errors raised as the registry's)."""
    with tempfile.TemporaryDirectory(prefix="test-partner-") as folder:
        path = Path(folder) / "partners.yaml"
        path.write_text(registry_text(entry), encoding="utf-8")
        (partner,) = load_partners(path)
    return partner


def _entry(defaults: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """``defaults`` updated by ``fields``; ``options`` merged section by section."""
    options = {**defaults.get("options", {}), **fields.pop("options", {})}
    return {**defaults, **fields, "options": options}


def oai_partner(id: str = "museum", *, retries: int = 2, **fields: Any) -> Partner:
    """An OAI-PMH partner (oai_dc, 10 minutes lag) with fast HTTP retries; registry keys override."""
    defaults = {"id": id, "protocol": "oai-pmh", "conn_id": "unused", "metadata_prefix": "oai_dc",
                "lag": "10m", "slicing": dict(WHOLE), "options": {"http": fast_http(retries)}}
    return partner_from_entry(_entry(defaults, fields))


def sierra_partner(id: str = "library", *, retries: int = 2, **fields: Any) -> Partner:
    """A Sierra partner (pages of 50, exports of 100) with fast HTTP and 5xx retries."""
    defaults = {"id": id, "protocol": "sierra", "conn_id": "unused", "page_size": 50, "slicing": dict(WHOLE),
                "options": {"http": fast_http(retries), "sierra": dict(FAST_SIERRA), "export": dict(SMALL_EXPORT)}}
    return partner_from_entry(_entry(defaults, fields))


AdapterT = TypeVar("AdapterT", bound=Adapter)


def built(kind: type[AdapterT], partner: Partner, endpoint: Endpoint) -> AdapterT:
    """``build_adapter`` for a test that reaches into the protocol's own adapter (its client)."""
    adapter = build_adapter(partner, endpoint)
    assert isinstance(adapter, kind), adapter
    return adapter
