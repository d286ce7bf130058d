"""The partner connection types: one per protocol (its spec's ``connection``), and the older ``http``.

A partner's Connection says where it lives and how to log in; these hooks are the one
place that reads it (``connections.partner_endpoint`` goes through them), so a Connection
made from the Connections page (the form fields declared in ``provider.py``) and one of
type ``http`` written as JSON before the connection types existed are read alike:

- host: the endpoint's base URL (a bare host gets ``schema`` as scheme and ``port``);
- login/password: Sierra's client key and secret; for an OAI-PMH (or IIIF) partner its
  credentials, sent as the extras ``auth``, ``auth_header``, ``auth_param`` say
  (``credentials.py``, which ``factory.credentials`` calls);
- extras ``verify`` (true, or the path of the partner's CA bundle), ``cert`` (a PEM with
  certificate and key, or ``[cert, key]``), ``proxies`` (``{"https": "http://proxy:3128"}``),
  or, from the form, ``proxy`` (one proxy URL for both schemes) and ``client_key`` (the key
  file beside ``cert``). Empty form fields mean "not set".

The hooks also report the endpoint to Airflow's hook-level lineage (``lineage.py``).
"""

from __future__ import annotations

import functools
from typing import Any, ClassVar

from airflow.sdk import BaseHook

from partner_harvest import protocols
from partner_harvest.factory import Endpoint

LEGACY = "http"  # every partner Connection before the connection types; still accepted


def transport_extra(extra: dict[str, Any]) -> dict[str, Any]:
    """The extras ``transport.Transport`` reads, from either way of writing them.

    A form leaves an unset field as ``""`` (or null): dropped here, since ``verify: ""``
    would read as "verification off", which the transport refuses.
    """
    out = {k: v for k, v in extra.items() if v not in ("", None)}
    proxy = out.pop("proxy", None)
    if proxy is not None and "proxies" not in out:
        out["proxies"] = {"http": proxy, "https": proxy}
    key = out.pop("client_key", None)
    if key is not None and isinstance(out.get("cert"), str):
        out["cert"] = [out["cert"], key]
    elif key is not None:
        raise ValueError("extra 'client_key' needs 'cert' (the client certificate) beside it")
    return out


class PartnerEndpointHook(BaseHook):
    """Reads a partner's Connection into an :class:`~partner_harvest.factory.Endpoint`."""

    conn_name_attr = "conn_id"
    default_conn_name = "partner_default"
    conn_type = LEGACY
    hook_name = "Partner endpoint"
    accepted: ClassVar[frozenset[str]] = frozenset({LEGACY, *(spec.connection.conn_type for spec in protocols.specs())})
    object_storage: ClassVar[bool] = False  # protocols.ConnectionType.object_storage

    def __init__(self, conn_id: str = default_conn_name, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.conn_id = conn_id

    def get_conn(self) -> Endpoint:
        return self.endpoint()

    def endpoint(self) -> Endpoint:
        conn = self.get_connection(self.conn_id)
        conn_type = (conn.conn_type or LEGACY).strip().lower()
        if conn_type not in self.accepted:
            raise ValueError(f"Connection '{self.conn_id}' is of type {conn_type!r}; a {self.hook_name} "
                             f"takes one of type {', '.join(sorted(self.accepted))}")
        host = (conn.host or "").strip()
        if "://" in host:
            base_url = host
        else:
            scheme = conn.schema or "https"
            port = f":{conn.port}" if conn.port else ""
            base_url = f"{scheme}://{host}{port}"
        extra = conn.extra_dejson
        return Endpoint(base_url=base_url, login=conn.login, password=conn.password,
                        extra=extra if self.object_storage else transport_extra(extra),
                        filesystem=self._object_storage(base_url) if self.object_storage else None)

    def _object_storage(self, url: str) -> Any:
        """The location through Airflow's object storage: ``ObjectStoragePath(url, conn_id=...)``'s
        filesystem, whose provider reads this Connection (the Amazon provider for s3://: login and
        password the key and secret, extra endpoint_url and region_name). None for a scheme no
        provider registers (an HTTP directory): the protocol opens it with fsspec itself."""
        from airflow.sdk import ObjectStoragePath

        try:
            return ObjectStoragePath(url, conn_id=self.conn_id).fs
        except ValueError:  # "No filesystem registered for scheme ..."
            return None


def _protocol_hook(connection: protocols.ConnectionType) -> type[PartnerEndpointHook]:
    """The hook class of a protocol's connection type, importable as ``hooks.<hook_class>``
    (the provider names it so; Airflow checks its ``conn_type``)."""
    return type(connection.hook_class, (PartnerEndpointHook,), {
        "__module__": __name__, "__qualname__": connection.hook_class, "__doc__": connection.doc,
        "conn_type": connection.conn_type, "hook_name": connection.hook_name,
        "accepted": frozenset({LEGACY, connection.conn_type}), "object_storage": connection.object_storage})


# protocol name -> its hook class; each also a name of this module (OaiPmhHook, SierraHook, ...)
PROTOCOL_HOOKS = {spec.name: _protocol_hook(spec.connection) for spec in protocols.specs()}
globals().update({cls.__name__: cls for cls in PROTOCOL_HOOKS.values()})


@functools.cache
def hook_for(protocol: str, conn_id: str) -> PartnerEndpointHook:
    """The hook of the partner's protocol (the registry's ``protocol``); one per process, so
    the lineage a task reports through it is one input however often it builds an adapter."""
    return PROTOCOL_HOOKS.get(protocol, PartnerEndpointHook)(conn_id=conn_id)


class AggregationHook(BaseHook):
    """The aggregation database (Connection ``aggregation_db``): the context the hook-level
    lineage reports its tables under (``connections.aggregation_conninfo`` reads it)."""

    conn_name_attr = "conn_id"
    default_conn_name = "aggregation_db"
    conn_type = "postgres"
    hook_name = "Partner harvest aggregation"

    def __init__(self, conn_id: str = default_conn_name, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.conn_id = conn_id

    def get_conn(self) -> Any:
        return self.get_connection(self.conn_id)


AGGREGATION = AggregationHook()  # the context of every table the lineage reports
