"""The package as an Airflow provider: ``get_provider_info`` (the ``apache_airflow_provider``
entry point of pyproject.toml), read by Airflow's ProvidersManager.

It declares the partner connection types with their form fields (declaratively, the way
Airflow 3.2+ reads them without importing the hooks; the hooks' ``get_connection_form_widgets``
is deprecated there) and the asset URI schemes of the hook-level lineage with their
OpenLineage converters. The health pages stay an Airflow plugin (the ``airflow.plugins``
entry point): declaring it here too would load it twice.
"""

from __future__ import annotations

from importlib import metadata
from typing import Any

from partner_harvest import protocols  # light: the protocols' specs, no HTTP stack
from partner_harvest.airflow import lineage  # light: no Airflow, no protocol stack

PACKAGE = "partner-harvest"
# Every Airflow process reads this on start: it names the hooks (airflow/hooks.py) without
# importing them, so the protocol stack loads only where a partner is harvested.
HOOKS_MODULE = "partner_harvest.airflow.hooks"


def _text(label: str, description: str) -> dict[str, Any]:
    return {"label": label, "description": description, "schema": {"type": ["string", "null"]}}


# The extras the partner's session reads (transport.Transport, via hooks.transport_extra).
TLS_AND_PROXY_FIELDS: dict[str, dict[str, Any]] = {
    "verify": _text("CA bundle", "Path, on every worker, of the partner's CA bundle (PEM) when its certificate is "
                    "not signed by a public CA, e.g. /etc/ssl/partners/museum-ca.pem. Empty: the system's CAs. "
                    "Verification cannot be switched off."),
    "cert": _text("Client certificate", "Path, on every worker, of the client certificate (PEM; with its key in "
                  "the same file, or the key below) when the partner requires mutual TLS, e.g. "
                  "/etc/ssl/harvester/client.pem. Empty: none."),
    "client_key": _text("Client key file", "Path of the client certificate's private key, when it is not in the "
                        "certificate's file, e.g. /etc/ssl/harvester/client.key. Empty: none."),
    "proxy": _text("Proxy", "Proxy URL for both http and https, e.g. http://proxy.example:3128 (user:password@ "
                   "inside it is kept secret). Empty: no proxy. For one proxy per scheme put "
                   "{\"proxies\": {\"https\": \"http://proxy.example:3128\"}} in Extra Fields JSON instead."),
}


# How the secret (the Connection's password) is sent (credentials.py reads them from the extras).
CREDENTIAL_FIELDS: dict[str, dict[str, Any]] = {
    "auth": _text("Credential form", "How the password is sent: empty with a login for HTTP Basic; bearer "
                  "(Authorization: Bearer <password>); header (the header named below carries it); query (the "
                  "query parameter named below, on every request). Empty without login or password: none."),
    "auth_header": _text("Credential header", "With form header: the header's name, e.g. Token or X-API-Key."),
    "auth_param": _text("Credential query parameter", "With form query: the parameter's name, e.g. apikey. "
                        "Sent only to the partner's own host; every URL we print shows it as ***."),
}


# The login and password of a protocol whose Connection authenticates its session (credentials.py).
CREDENTIAL_LABELS = {"login": "Login (HTTP Basic)", "password": "Secret (password, token or key)"}
CREDENTIAL_PLACEHOLDERS = {"login": "only for HTTP Basic; empty for no credentials or another form",
                           "password": "the secret the partner gave you; empty: none"}


def connection_types() -> list[dict[str, Any]]:
    """One connection type per protocol (its spec's ``connection``), with the TLS and proxy fields
    (an object-storage type: its own fields instead)."""
    return [
        {
            "connection-type": spec.connection.conn_type,
            "hook-class-name": f"{HOOKS_MODULE}.{spec.connection.hook_class}",
            "hook-name": spec.connection.hook_name,
            "conn-fields": {**(CREDENTIAL_FIELDS if spec.session_credentials else {}),
                            **({} if spec.connection.object_storage else TLS_AND_PROXY_FIELDS),
                            **{name: _text(label, text) for name, (label, text) in spec.connection.fields.items()}},
            "ui-field-behaviour": {
                "hidden-fields": list(spec.connection.hidden_fields),
                "relabeling": {**(CREDENTIAL_LABELS if spec.session_credentials else {}), **spec.connection.relabeling},
                "placeholders": {**(CREDENTIAL_PLACEHOLDERS if spec.session_credentials else {}),
                                 **spec.connection.placeholders},
            },
        }
        for spec in protocols.specs()
    ]


def _version() -> str:
    try:
        return metadata.version(PACKAGE)
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "0.0.0"


def config() -> dict[str, Any]:
    """The ``[partner_harvest]`` settings, listed by ``airflow config list`` with Airflow's own."""
    return {"partner_harvest": {
        "description": "Settings of the partner harvest package.",
        "options": {
            "docs_url": {
                "description": "Where the deployment publishes this project's docs/ folder (an absolute URL): "
                               "approval requests link to its pages (operator/approvals.md). Empty: no docs "
                               "link (a relative one would open Airflow's 404 page).",
                "version_added": "0.1.0",
                "type": "string",
                "example": "https://git.example.org/aggregator/partner-harvest/blob/main/docs",
                "default": "",
            },
        },
    }}


def get_provider_info() -> dict[str, Any]:
    """What ProvidersManager reads (airflow/provider_info.schema.json)."""
    return {
        "package-name": PACKAGE,
        "name": "Partner harvest",
        "description": f"{', '.join(spec.title for spec in protocols.specs())} partners harvested into a "
                       "PostgreSQL aggregation: partner connection types, lineage, metrics",
        "versions": [_version()],
        "connection-types": connection_types(),
        "config": config(),
        "asset-uris": [{
            "schemes": [*lineage.ENDPOINT_SCHEMES, lineage.TABLE_SCHEME],
            "handler": "partner_harvest.airflow.lineage.normalize",
            "to_openlineage_converter": "partner_harvest.airflow.lineage.to_openlineage",
        }],
    }
