"""Building the right adapter for a partner from its registry entry and endpoint."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import requests

from partner_harvest.adapters import Adapter
from partner_harvest.credentials import Credentials, from_connection
from partner_harvest.errors import ConfigurationError
from partner_harvest.oai.chain_caps import ChainCaps
from partner_harvest.oai.client import OaiClient
from partner_harvest.oai.harvester import OaiAdapter
from partner_harvest.politeness import Pacer, PacingStore, endpoint_host
from partner_harvest.registry import Partner
from partner_harvest.transport import HttpPolicy, Transport, build_session
from partner_harvest.xmlsafe import XmlLimits


@dataclass(frozen=True)
class Endpoint:
    """Where a partner lives and how to log in; built from an Airflow Connection."""

    base_url: str
    login: str | None = None
    password: str | None = field(default=None, repr=False)
    extra: dict[str, Any] = field(default_factory=dict, repr=False)  # may name proxy credentials


def http_policy(partner: Partner) -> HttpPolicy:
    """The partner's ``options.http`` (validated by the registry), with Sierra's one rule.

    Sierra 500s carry error codes (138 rate limit, 135 export failure) that the client
    must see, so unless the registry says otherwise the transport does not retry 500 for
    Sierra, nor 429, whose Retry-After the client weighs (a long wait frees the worker slot
    instead of sleeping): sierra.client.TRANSPORT_RETRY_STATUSES.
    """
    policy = partner.options.http
    if partner.protocol == "sierra" and "retry_statuses" not in policy.model_fields_set:
        from partner_harvest.sierra.client import TRANSPORT_RETRY_STATUSES

        return policy.model_copy(update={"retry_statuses": TRANSPORT_RETRY_STATUSES})
    return policy


def transport(partner: Partner, endpoint: Endpoint) -> Transport:
    """TLS and proxy settings from the Connection's extras (``verify``, ``cert``, ``proxies``)."""
    try:
        return Transport.from_extra(endpoint.extra)
    except ValueError as exc:
        raise ConfigurationError(partner.id, f"Connection '{partner.conn_id}'", str(exc)) from None


def credentials(partner: Partner, endpoint: Endpoint) -> Credentials | None:
    """The Connection's credentials (credentials.py: Basic, Bearer, a header or a query
    parameter); none for Sierra, whose login and password are its API client's key and secret."""
    if partner.protocol == "sierra":
        return None
    try:
        return from_connection(endpoint.login, endpoint.password, endpoint.extra)
    except ValueError as exc:
        raise ConfigurationError(partner.id, f"Connection '{partner.conn_id}'", str(exc)) from None


def pacer(partner: Partner, endpoint: Endpoint, store: Callable[[], PacingStore] | None) -> Pacer | None:
    """The partner's politeness at its endpoint host; None without a pacing store, or with
    nothing to pace (no request_delay and the adaptive back-off off)."""
    politeness = partner.options.politeness
    if store is None or (partner.request_delay == 0 and not politeness.adaptive):
        return None
    return Pacer(partner.id, endpoint_host(endpoint.base_url), partner.request_delay, politeness, store)


def build_adapter(partner: Partner, endpoint: Endpoint, *, pacing: Callable[[], PacingStore] | None = None,
                  on_response: Callable[[requests.Response], Any] | None = None) -> Adapter:
    """``pacing`` opens the shared pacing state (``store.pacing.PgPacingStore``), called only
    when a request first needs it; without it the partner's requests are not paced.
    ``on_response``: called with every response the partner's session receives (the Airflow
    layer counts requests and bytes with it)."""
    policy = http_policy(partner)
    auth = credentials(partner, endpoint)
    session = build_session(partner.id, policy, home=endpoint.base_url, transport=transport(partner, endpoint),
                            pacer=pacer(partner, endpoint, pacing), credentials=auth)
    if on_response is not None:
        session.hooks["response"].append(lambda response, *args, **kwargs: on_response(response))
    if partner.protocol == "oai-pmh":
        oai = OaiClient(partner.id, endpoint.base_url, session, xml_limits=XmlLimits(policy.max_xml_nodes),
                        caps=ChainCaps.from_limits(partner.options.limits))
        return OaiAdapter(partner, oai)
    if partner.protocol == "sierra":
        # Imported here: an OAI-PMH worker process (a slice's) need not load the Sierra stack.
        from partner_harvest.sierra.client import SierraClient
        from partner_harvest.sierra.harvester import SierraAdapter

        options = partner.options.sierra
        sierra = SierraClient(partner.id, endpoint.base_url, session, endpoint.login or "", endpoint.password or "",
                              refresh_margin=options.refresh_margin, server_error_tries=options.server_error_tries,
                              server_error_backoff=options.server_error_backoff,
                              transport_retries=policy.retry_statuses)
        return SierraAdapter(partner, sierra)
    if partner.protocol == "iiif-change-discovery":
        from partner_harvest.iiif.client import IiifClient
        from partner_harvest.iiif.harvester import IiifAdapter

        iiif = partner.options.iiif
        client = IiifClient(partner.id, endpoint.base_url, session, page_delay=iiif.page_delay,
                            max_pages=iiif.max_pages,
                            session_factory=lambda: build_session(partner.id, policy, home=endpoint.base_url,
                                                                  transport=transport(partner, endpoint),
                                                                  credentials=auth))
        return IiifAdapter(partner, client)
    raise ConfigurationError(partner.id, "registry", f"protocol {partner.protocol!r} is not supported yet")
