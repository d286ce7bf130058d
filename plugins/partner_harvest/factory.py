"""Building the right adapter for a partner from its registry entry and endpoint."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from partner_harvest.adapters import Adapter
from partner_harvest.errors import ConfigurationError
from partner_harvest.http import RETRY_STATUSES, HttpPolicy, build_session
from partner_harvest.oai.client import OaiClient
from partner_harvest.oai.harvester import OaiAdapter
from partner_harvest.registry import Partner
from partner_harvest.sierra.client import SierraClient
from partner_harvest.sierra.harvester import SierraAdapter


@dataclass(frozen=True)
class Endpoint:
    """Where a partner lives and how to log in; built from an Airflow Connection."""

    base_url: str
    login: str | None = None
    password: str | None = field(default=None, repr=False)
    extra: dict[str, Any] = field(default_factory=dict)


def http_policy(partner: Partner) -> HttpPolicy:
    """Per-partner HTTP overrides from the registry's ``options.http`` mapping.

    Sierra 500s carry error codes (138 rate limit, 135 export failure) that the client
    must see, so for Sierra the transport does not retry 500 by itself.
    """
    overrides = dict(partner.options.get("http", {}) or {})
    if partner.protocol == "sierra":
        overrides.setdefault("retry_statuses", RETRY_STATUSES - {500})
    if "retry_statuses" in overrides:
        overrides["retry_statuses"] = frozenset(overrides["retry_statuses"])
    allowed = set(HttpPolicy.__dataclass_fields__)
    unknown = set(overrides) - allowed
    if unknown:
        raise ConfigurationError(partner.id, "registry", f"unknown options.http keys: {sorted(unknown)}")
    return HttpPolicy(**overrides)


def build_adapter(partner: Partner, endpoint: Endpoint) -> Adapter:
    session = build_session(partner.id, http_policy(partner))
    if partner.protocol == "oai-pmh":
        return OaiAdapter(partner, OaiClient(partner.id, endpoint.base_url, session))
    if partner.protocol == "sierra":
        sierra = dict(partner.options.get("sierra", {}) or {})
        client = SierraClient(partner.id, endpoint.base_url, session, endpoint.login or "", endpoint.password or "", **sierra)
        return SierraAdapter(partner, client)
    raise ConfigurationError(partner.id, "registry", f"protocol {partner.protocol!r} is not supported yet")
