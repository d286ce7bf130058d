"""The package as an Airflow provider: its provider info passes Airflow's own schema checks, names
hooks that exist with the connection types it declares, and the hooks read a partner
Connection of every accepted type (``http`` as before, ``oai_pmh``, ``sierra``) the same way,
form fields included (docs/operator/connections.md)."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from urllib.parse import unquote

import pytest

from partner_harvest.airflow import hooks, lineage, provider
from partner_harvest.oai.harvester import OaiAdapter
from partner_harvest.sierra.harvester import SierraAdapter
from tests.support.partners import built, oai_partner, sierra_partner

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]


def test_the_provider_info_passes_airflows_schema_and_names_this_package() -> None:
    from airflow._shared.providers_discovery.providers_discovery import (
        _create_customized_form_field_behaviours_schema_validator,
        _create_provider_info_schema_validator,
    )

    info = provider.get_provider_info()
    _create_provider_info_schema_validator().validate(info)
    assert info["package-name"] == PROJECT["name"]  # ProvidersManager refuses a mismatch
    behaviours = _create_customized_form_field_behaviours_schema_validator()
    for conn in info["connection-types"]:
        ui = conn["ui-field-behaviour"]
        behaviours.validate({"hidden_fields": ui["hidden-fields"], "relabeling": ui["relabeling"],
                             "placeholders": ui["placeholders"]})


def test_the_entry_point_is_get_provider_info() -> None:
    assert PROJECT["entry-points"]["apache_airflow_provider"] == {
        "provider_info": "partner_harvest.airflow.provider:get_provider_info"}


def test_each_connection_type_names_a_hook_of_that_type() -> None:
    import importlib

    from partner_harvest import protocols

    declared = {c["connection-type"]: c for c in provider.get_provider_info()["connection-types"]}
    assert set(declared) == {spec.connection.conn_type for spec in protocols.specs()}  # one per protocol
    assert len(declared) == len(protocols.specs()) == len(hooks.PROTOCOL_HOOKS) >= 3  # IIIF's too
    for conn_type, conn in declared.items():
        module, _, name = conn["hook-class-name"].rpartition(".")
        hook = getattr(importlib.import_module(module), name)
        assert hook.conn_type == conn_type and hook.hook_name == conn["hook-name"]
        assert hooks.LEGACY in hook.accepted  # Connections of type http keep working
        # every form field is an extra the hooks turn into what the transport reads, and for
        # OAI-PMH (and IIIF) how the password is sent (credentials.py); Sierra's client logs in itself;
        # an object-storage location (file deliveries) has its store's fields instead
        spec = next(spec for spec in protocols.specs() if spec.connection.conn_type == conn_type)
        credentials = {"auth", "auth_header", "auth_param"} if spec.session_credentials else set()
        transport = set() if spec.connection.object_storage else {"verify", "cert", "client_key", "proxy"}
        assert set(conn["conn-fields"]) == transport | credentials | set(spec.connection.fields)
    assert {spec.name for spec in protocols.specs() if spec.session_credentials} >= {"oai-pmh", "iiif-change-discovery"}


def test_the_lineage_schemes_convert_to_openlineage_names() -> None:
    pytest.importorskip("openlineage.client")
    from airflow.sdk import Asset

    info = provider.get_provider_info()["asset-uris"][0]
    endpoint = lineage.endpoint_uri("oai-pmh", "https://user:secret@Museum.example:8443/oai?x=1")
    assert endpoint == "oai-pmh+https://museum.example:8443/oai"  # no credentials, no query
    assert endpoint.split("://")[0] in info["schemes"]
    dataset = lineage.to_openlineage(Asset(uri=endpoint))
    assert (dataset.namespace, dataset.name) == ("https://museum.example:8443", "/oai")
    table = lineage.table_uri("/tmp/pg sock", 5433, "agg", "public", "records")
    dataset = lineage.to_openlineage(Asset(uri=table))
    # Airflow's Asset normalises the authority's case (%2f or %2F): compare it decoded
    assert (unquote(dataset.namespace), dataset.name) == ("postgres:///tmp/pg sock:5433", "agg.public.records")


def _conn(monkeypatch: pytest.MonkeyPatch, conn_id: str, **fields: object) -> None:
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(fields))


@pytest.mark.parametrize("conn_type", ["http", "oai_pmh"])
def test_an_oai_pmh_partner_reads_http_and_oai_pmh_connections_alike(monkeypatch: pytest.MonkeyPatch, conn_type: str,
                                                                     tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("not parsed here")
    _conn(monkeypatch, "partner_museum", conn_type=conn_type, host="https://museum.example/oai",
          extra={"verify": str(ca), "proxies": {"https": "http://user:pw@proxy.example:3128"}})
    endpoint = hooks.hook_for("oai-pmh", "partner_museum").endpoint()
    assert endpoint.base_url == "https://museum.example/oai"
    session = built(OaiAdapter, oai_partner("museum"), endpoint).client.session
    assert session.verify == str(ca) and session.proxies == {"https": "http://user:pw@proxy.example:3128"}


def test_the_form_fields_reach_the_session_and_empty_ones_mean_unset(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The Connections form saves a field left empty as null (tests/e2e/test_connections_page.py):
    a CA bundle of null (or "") read as "verification off" and was refused; it means the system's CAs."""
    cert, key = tmp_path / "client.pem", tmp_path / "client.key"
    cert.write_text("x")
    key.write_text("x")
    _conn(monkeypatch, "partner_lib", conn_type="sierra", host="https://lib.example/iii/sierra-api",
          login="key", password="secret",
          extra={"verify": None, "cert": str(cert), "client_key": str(key), "proxy": "http://proxy.example:3128"})
    endpoint = hooks.hook_for("sierra", "partner_lib").endpoint()
    assert (endpoint.login, endpoint.password) == ("key", "secret")
    session = built(SierraAdapter, sierra_partner("lib", conn_id="partner_lib"), endpoint).client.session
    assert session.verify is True
    assert session.cert == (str(cert), str(key))
    assert session.proxies == {"http": "http://proxy.example:3128", "https": "http://proxy.example:3128"}


def test_a_connection_of_the_other_protocols_type_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    _conn(monkeypatch, "partner_lib", conn_type="oai_pmh", host="https://lib.example/iii/sierra-api")
    with pytest.raises(ValueError, match="type 'oai_pmh'; a Sierra ILS partner takes one of type http, sierra"):
        hooks.hook_for("sierra", "partner_lib").endpoint()
    assert hooks.hook_for("oai-pmh", "partner_lib").endpoint().base_url == "https://lib.example/iii/sierra-api"


@pytest.mark.parametrize("empty", [None, ""])
def test_an_empty_form_field_is_unset(empty: object) -> None:
    assert hooks.transport_extra({"verify": empty, "cert": empty, "client_key": empty, "proxy": empty}) == {}


def test_a_connection_saved_by_the_form_with_the_ca_bundle_left_empty_verifies_with_the_system_cas(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression: the Connections form saves the fields left empty as null; read whole, the
    extras' ``"verify": null`` was taken for "verification off" and the partner refused."""
    from partner_harvest.airflow.connections import partner_endpoint

    _conn(monkeypatch, "partner_museum", conn_type="http", host="https://museum.example/oai",
          extra={"verify": None, "cert": None, "proxy": None})
    session = built(OaiAdapter, oai_partner("museum"), partner_endpoint("partner_museum")).client.session
    assert session.verify is True and session.cert is None and session.proxies == {}


def test_every_registry_protocol_has_a_lineage_scheme() -> None:
    """A third protocol (IIIF) failed every task with KeyError 'iiif-change-discovery' once
    lineage named endpoints by a hand-kept table of the first two."""
    from partner_harvest.registry import registry_schema

    for protocol in registry_schema()["$defs"]["Partner"]["properties"]["protocol"]["enum"]:
        assert lineage.endpoint_uri(protocol, "https://museum.example/stream").startswith(f"{protocol}+https://")
        assert f"{protocol}+https" in provider.get_provider_info()["asset-uris"][0]["schemes"]
