"""Building the right adapter for a partner from its registry entry and endpoint."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import requests

from partner_harvest.adapters import Adapter
from partner_harvest.credentials import Credentials, from_connection
from partner_harvest.errors import ConfigurationError
from partner_harvest.politeness import Pacer, PacingStore, endpoint_host
from partner_harvest.protocols import spec_of
from partner_harvest.registry import Partner
from partner_harvest.transport import HttpPolicy, RequestPacer, Transport, build_session


@dataclass(frozen=True)
class Endpoint:
    """Where a partner lives and how to log in; built from an Airflow Connection."""

    base_url: str
    login: str | None = None
    password: str | None = field(default=None, repr=False)
    extra: dict[str, Any] = field(default_factory=dict, repr=False)  # may name proxy credentials
    # The location as an fsspec filesystem, opened by the Airflow layer through its object storage
    # (ConnectionType.object_storage); None: the protocol opens its location itself.
    filesystem: Any = field(default=None, repr=False, compare=False)


@dataclass(frozen=True)
class Wiring:
    """What a protocol's ``build`` (protocols.ProtocolSpec) makes its client and adapter from."""

    partner: Partner
    endpoint: Endpoint
    session: requests.Session  # the partner's session: its policy, transport, credentials, pacing, response hooks
    policy: HttpPolicy  # the session's policy (http_policy)
    credentials: Credentials | None  # the session's (credentials())
    counted: Callable[..., None] | None = None  # the response hook counting Adapter.responses

    def new_session(self) -> requests.Session:
        """Another session of the same policy, transport and credentials, unpaced (a client's
        worker threads); its responses count as the adapter's too."""
        session = build_session(self.partner.id, self.policy, home=self.endpoint.base_url,
                                transport=transport(self.partner, self.endpoint), credentials=self.credentials)
        if self.counted is not None:
            session.hooks["response"].append(self.counted)
        return session


def http_policy(partner: Partner) -> HttpPolicy:
    """The partner's ``options.http`` (validated by the registry), without the statuses its
    protocol's client reads itself (``ProtocolSpec.client_statuses``: Sierra's 500s carry error
    codes the client must see, and its 429s a wait the harvester weighs, freeing the worker
    slot instead of sleeping) unless the registry lists ``retry_statuses`` itself."""
    policy = partner.options.http
    own = spec_of(partner.protocol).client_statuses
    if own and "retry_statuses" not in policy.model_fields_set:
        return policy.model_copy(update={"retry_statuses": policy.retry_statuses - own})
    return policy


def transport(partner: Partner, endpoint: Endpoint) -> Transport:
    """TLS and proxy settings from the Connection's extras (``verify``, ``cert``, ``proxies``)."""
    try:
        return Transport.from_extra(endpoint.extra)
    except ValueError as exc:
        raise ConfigurationError(partner.id, f"Connection '{partner.conn_id}'", str(exc)) from None


def credentials(partner: Partner, endpoint: Endpoint) -> Credentials | None:
    """The Connection's credentials (credentials.py: Basic, Bearer, a header or a query
    parameter); none for a protocol whose client logs in itself (``ProtocolSpec.session_credentials``:
    Sierra's login and password are its API client's key and secret)."""
    if not spec_of(partner.protocol).session_credentials:
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
                  on_response: Callable[[requests.Response], Any] | None = None,
                  paced_by: RequestPacer | None = None) -> Adapter:
    """The partner's adapter, built by its protocol's spec (``protocols.ProtocolSpec.build``,
    which imports only its own stack). ``pacing`` opens the shared pacing state
    (``store.pacing.PgPacingStore``), called only when a request first needs it; without it
    the partner's requests are not paced. ``paced_by``: a pacer of the caller's own instead
    (the readiness check's budget, readiness.py). ``on_response``: called with every response
    the partner's session receives (the Airflow layer counts requests and bytes with it)."""
    policy = http_policy(partner)
    auth = credentials(partner, endpoint)
    session = build_session(partner.id, policy, home=endpoint.base_url, transport=transport(partner, endpoint),
                            pacer=paced_by or pacer(partner, endpoint, pacing), credentials=auth)
    if on_response is not None:
        session.hooks["response"].append(lambda response, *args, **kwargs: on_response(response))
    built: list[Adapter] = []

    def count(response: requests.Response, *args: Any, **kwargs: Any) -> None:
        if built:  # Adapter.responses: what a step spent (the content check reports it)
            built[0].responses += 1

    session.hooks["response"].append(count)
    adapter = spec_of(partner.protocol).build(Wiring(partner, endpoint, session, policy, auth, count))
    built.append(adapter)
    return adapter
