"""Hostile or broken partners can neither exhaust a worker nor redirect our credentials.

Each hostile behaviour is a switch of the OAI-PMH simulator (``attack_next``) or a small
loopback listener here; the harvest runs the pipeline the DAG tasks call, over real HTTP
(and real TLS) on loopback, against real PostgreSQL.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import ssl
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import SplitResult, quote_plus

import psycopg
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from include.simulators.loopback import TEXT_TYPE, LoopbackHandler, LoopbackServer, Response
from include.simulators.oai_pmh import OaiSimulator, SimulatedRepository
from partner_harvest import pipeline
from partner_harvest.credentials import Credentials
from partner_harvest.errors import ConfigurationError, PartnerDataError, PartnerHttpError
from partner_harvest.factory import Endpoint, build_adapter
from partner_harvest.oai.harvester import OaiAdapter
from partner_harvest.records import HarvestStats
from partner_harvest.registry import Partner, RegistryError
from partner_harvest.store import RunRef
from partner_harvest.transport import HttpPolicy, PartnerSession, Transport, build_session
from tests.support.partners import built, fast_http, oai_partner


def partner(**http: Any) -> Partner:
    return oai_partner(conn_id="partner_museum", options={"http": fast_http(**{"retries": 3, **http})})


def harvest(base_url: str, conn: psycopg.Connection, p: Partner, extra: dict[str, Any] | None = None) -> HarvestStats:
    """freeze_window + harvest_window of a full run, as the DAG's tasks do."""
    adapter = build_adapter(p, Endpoint(base_url, extra=extra or {}))
    window = pipeline.freeze_window(adapter, p.lag, None, pipeline.RunRequest("full"))
    return pipeline.harvest_window(adapter, conn, RunRef(p.id, "run-1"), window)


def list_requests(sim: OaiSimulator) -> list[dict]:
    return [r for r in sim.requests if r.get("verb") == "ListRecords"]


@pytest.fixture
def sim() -> Iterator[OaiSimulator]:
    with OaiSimulator(SimulatedRepository(records=120, page_size=40, seed=5)) as server:
        yield server


# ------------------------------------------------------------------- bodies


@pytest.mark.parametrize("kind", ["gzip_bomb", "endless_body"])
def test_a_body_past_the_cap_fails_naming_partner_request_and_cap(sim: OaiSimulator, conn: psycopg.Connection, kind: str) -> None:
    sim.attack_next(kind, size=64 << 20, verb="ListRecords")
    with pytest.raises(PartnerHttpError) as err:
        harvest(sim.base_url, conn, partner(max_response_bytes=1 << 20))
    message = str(err.value)
    assert "partner 'museum'" in message and "verb=ListRecords" in message
    assert "cap of 1,048,576 bytes" in message and "options.http.max_response_bytes" in message
    assert len(list_requests(sim)) == 1  # refused once, not fetched again by urllib3
    assert sim.errors == []


def test_honest_pages_under_the_cap_still_land(sim: OaiSimulator, conn: psycopg.Connection) -> None:
    stats = harvest(sim.base_url, conn, partner(max_response_bytes=256 << 10))
    assert stats.fetched == 120


# ----------------------------------------------------------------- deadline


@pytest.mark.parametrize("headers", [False, True], ids=["body-drips", "headers-drip"])
def test_a_slow_drip_ends_at_the_deadline_and_is_not_retried_by_urllib3(sim: OaiSimulator, conn: psycopg.Connection, headers: bool) -> None:
    # One byte every 0.2 s never trips the 30 s read timeout; only the total deadline ends it.
    sim.attack_next("slow_drip", interval=0.2, headers=headers, verb="ListRecords")
    started = time.monotonic()
    with pytest.raises(PartnerHttpError) as err:
        harvest(sim.base_url, conn, partner(request_deadline=1.0, retries=3))
    elapsed = time.monotonic() - started
    message = str(err.value)
    assert "partner 'museum'" in message and "verb=ListRecords" in message
    assert "request deadline of 1 s" in message and "options.http.request_deadline" in message
    # A TimeoutError here would have been a socket timeout to urllib3: three more attempts.
    assert len(list_requests(sim)) == 1
    assert elapsed < 10


def test_waits_between_retries_do_not_count_against_the_deadline(sim: OaiSimulator, conn: psycopg.Connection) -> None:
    sim.fail_next(2, 503, retry_after=1)  # two polite waits of 1 s each, deadline 0.8 s
    stats = harvest(sim.base_url, conn, partner(request_deadline=0.8, retries=3))
    assert stats.fetched == 120


# ---------------------------------------------------------------------- XML


@pytest.mark.parametrize("kind,size,cause", [
    ("deep_xml", 100_000, "Excessive depth"),
    ("wide_xml", 3_000_000, "more than the limit of 2,000,000"),
    ("many_attributes", 1_100_000, "more than the limit of 2,000,000"),
])
def test_pathological_xml_fails_clearly(sim: OaiSimulator, conn: psycopg.Connection, kind: str, size: int,
                                      cause: str) -> None:
    sim.attack_next(kind, size=size, verb="ListRecords")
    with pytest.raises(PartnerDataError) as err:
        harvest(sim.base_url, conn, partner())
    message = str(err.value)
    assert "partner 'museum'" in message and "verb=ListRecords" in message and cause in message


def test_the_node_limit_is_the_partners_own(sim: OaiSimulator, conn: psycopg.Connection) -> None:
    # 40 oai_dc records make about 1,500 nodes: over a limit of 1,000, under the default.
    with pytest.raises(PartnerDataError, match=r"limit of 1,000 \(options.http.max_xml_nodes\)"):
        harvest(sim.base_url, conn, partner(max_xml_nodes=1000))


# -------------------------------------------------------------- credentials


class _Recorder(LoopbackServer):
    """Answers 200 and keeps the headers of every request; redirects when told to."""

    def __init__(self) -> None:
        super().__init__("127.0.0.1", 0, _RecorderHandler)
        self.redirect_to: str | None = None
        self.seen: list[dict[str, str]] = []


class _RecorderHandler(LoopbackHandler):
    def _respond(self, url: SplitResult, body: bytes | None) -> Response:
        sim = self.sim
        assert isinstance(sim, _Recorder)
        with sim._lock:
            sim.seen.append({"path": url.path, "query": url.query, **dict(self.headers.items())})
        if sim.redirect_to and url.path == "/start":
            return Response(302, b"", TEXT_TYPE, {"Location": sim.redirect_to})
        return Response(200, b"ok\n", TEXT_TYPE)

    def _send(self, response: Response) -> None:
        self.send_response(response.status)
        self.send_header("Content-Type", response.content_type)
        for name, value in response.headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(response.body)))
        self.end_headers()
        self.wfile.write(response.body)


@pytest.fixture
def partner_and_stranger() -> Iterator[tuple[_Recorder, _Recorder]]:
    with _Recorder() as home, _Recorder() as stranger:
        yield home, stranger


def authorization(seen: list[dict[str, str]]) -> list[str | None]:
    return [h.get("Authorization") for h in seen]


@pytest.mark.parametrize("auth", ["basic", "bearer"])
def test_a_redirect_to_another_origin_never_carries_credentials(partner_and_stranger: tuple[_Recorder, _Recorder],
                                                               auth: str) -> None:
    home, stranger = partner_and_stranger
    home.redirect_to = f"{stranger.base_url}/landing"  # same host, another port: another origin
    session = build_session("museum", home=home.base_url)
    kwargs = {"auth": ("client-key", "secret")} if auth == "basic" else {"headers": {"Authorization": "Bearer t0k3n"}}
    assert session.get(f"{home.base_url}/start", **kwargs).status_code == 200
    assert authorization(home.seen) != [None]  # the partner itself got them
    assert authorization(stranger.seen) == [None]


@pytest.mark.parametrize("form", ["basic", "bearer", "header", "query"])
def test_the_connections_credentials_go_to_the_partner_and_nowhere_else(partner_and_stranger: tuple[_Recorder, _Recorder],
                                                                       form: str) -> None:
    """A redirect to another origin (whose Location even repeats the key) gets none of them;
    one within the origin, and a second request, get them again."""
    home, stranger = partner_and_stranger
    secret = "k3y+of/the=museum"
    credentials = Credentials(form, secret, login="harvester" if form == "basic" else None,
                              name={"header": "Token", "query": "apikey"}.get(form))
    session = build_session("museum", home=home.base_url, credentials=credentials)
    home.redirect_to = f"{stranger.base_url}/landing?apikey={quote_plus(secret)}&verb=Identify"
    session.get(f"{home.base_url}/start", params={"verb": "Identify"})
    home.redirect_to = f"{home.base_url}/elsewhere"
    session.get(f"{home.base_url}/start")
    carried = [(h.get(credentials.header or "") or "") + h["query"] for h in home.seen]
    assert len(carried) == 3 and all(quote_plus(secret) in c or "Basic " in c or secret in c for c in carried), carried
    assert stranger.seen and not any("k3y" in json.dumps(h) or "Authorization" in h or "Token" in h
                                     for h in stranger.seen), stranger.seen


def test_a_same_origin_redirect_keeps_credentials(partner_and_stranger: tuple[_Recorder, _Recorder]) -> None:
    home, _ = partner_and_stranger
    home.redirect_to = f"{home.base_url}/elsewhere"
    session = build_session("museum", home=home.base_url)
    session.get(f"{home.base_url}/start", headers={"Authorization": "Bearer t0k3n"})
    assert authorization(home.seen) == ["Bearer t0k3n", "Bearer t0k3n"]


def test_a_url_the_partner_hands_us_gets_no_credentials(partner_and_stranger: tuple[_Recorder, _Recorder]) -> None:
    """E.g. a download link in a response body pointing at another host or port."""
    home, stranger = partner_and_stranger
    session = build_session("museum", home=f"{home.base_url}/iii/sierra-api/v6")
    session.get(f"{stranger.base_url}/file/export-1.mrc", headers={"Authorization": "Bearer t0k3n"})
    session.get(f"{stranger.base_url}/file/export-2.mrc", auth=("client-key", "secret"))
    assert authorization(stranger.seen) == [None, None]


def test_the_connections_proxy_is_used_and_wins_over_the_environment(partner_and_stranger: tuple[_Recorder, _Recorder],
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    proxy, decoy = partner_and_stranger
    monkeypatch.setenv("HTTP_PROXY", decoy.base_url)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    session = build_session("museum", HttpPolicy(retries=0), home="http://museum.invalid/oai",
                            transport=Transport(proxies={"http": proxy.base_url}))
    assert session.get("http://museum.invalid/oai", params={"verb": "Identify"}).status_code == 200
    assert [h["Host"] for h in proxy.seen] == ["museum.invalid"] and decoy.seen == []


# ---------------------------------------------------------------------- TLS


@dataclass
class Pki:
    ca: Path
    server_context: ssl.SSLContext
    client_pem: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _issue(subject: str, key: ec.EllipticCurvePrivateKey, issuer_name: x509.Name, issuer_key: ec.EllipticCurvePrivateKey, *,
           ca: bool = False, ip: str | None = None) -> x509.Certificate:
    now = dt.datetime.now(dt.timezone.utc)
    builder = (x509.CertificateBuilder().subject_name(_name(subject)).issuer_name(issuer_name)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if ip:
        builder = builder.add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(ip))]),
                                        critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def _pem(cert: x509.Certificate, key: ec.EllipticCurvePrivateKey | None = None) -> bytes:
    out = cert.public_bytes(serialization.Encoding.PEM)
    if key is not None:
        out += key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                 serialization.NoEncryption())
    return out


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """A partner's private CA, its server certificate for 127.0.0.1, and our client certificate."""
    root = tmp_path_factory.mktemp("pki")
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = _issue("Partner Test CA", ca_key, _name("Partner Test CA"), ca_key, ca=True)
    server_key = ec.generate_private_key(ec.SECP256R1())
    server_cert = _issue("127.0.0.1", server_key, ca_cert.subject, ca_key, ip="127.0.0.1")
    client_key = ec.generate_private_key(ec.SECP256R1())
    client_cert = _issue("aggregator", client_key, ca_cert.subject, ca_key)
    (root / "ca.pem").write_bytes(_pem(ca_cert))
    (root / "server.pem").write_bytes(_pem(server_cert, server_key))
    (root / "client.pem").write_bytes(_pem(client_cert, client_key))
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(root / "ca.pem"))
    context.load_cert_chain(root / "server.pem")
    context.verify_mode = ssl.CERT_REQUIRED  # the partner wants our client certificate
    return Pki(root / "ca.pem", context, root / "client.pem")


@pytest.fixture
def tls_sim(pki: Pki) -> Iterator[OaiSimulator]:
    server = OaiSimulator(SimulatedRepository(records=60, page_size=30, seed=9))
    server.tls = pki.server_context
    with server:
        yield server


def test_tls_with_the_partners_ca_and_our_client_certificate(tls_sim: OaiSimulator, conn: psycopg.Connection, pki: Pki) -> None:
    extra = {"verify": str(pki.ca), "cert": str(pki.client_pem)}
    stats = harvest(tls_sim.base_url, conn, partner(), extra)
    assert tls_sim.base_url.startswith("https://") and stats.fetched == 60


@pytest.mark.parametrize("extra", [{}, {"verify": "ca"}], ids=["system-cas", "no-client-cert"])
def test_tls_fails_without_the_partners_ca_or_our_certificate(tls_sim: OaiSimulator, conn: psycopg.Connection, pki: Pki,
                                                              extra: dict[str, str]) -> None:
    if extra:
        extra = {"verify": str(pki.ca)}
    with pytest.raises(PartnerHttpError, match="SSLError|ConnectionError"):
        harvest(tls_sim.base_url, conn, partner(retries=0), extra)


def test_switching_verification_off_is_refused(tls_sim: OaiSimulator, conn: psycopg.Connection) -> None:
    with pytest.raises(ConfigurationError) as err:
        harvest(tls_sim.base_url, conn, partner(), {"verify": False})
    assert "Connection 'partner_museum'" in str(err.value) and "refused" in str(err.value)
    assert tls_sim.requests == []


def test_a_partner_ca_bundle_wins_over_requests_ca_bundle(tls_sim: OaiSimulator, pki: Pki, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", "/nonexistent/system-bundle.pem")
    session = build_session("museum", HttpPolicy(retries=0), home=tls_sim.base_url,
                            transport=Transport(verify=str(pki.ca), cert=str(pki.client_pem)))
    assert session.get(tls_sim.base_url, params={"verb": "Identify"}).status_code == 200


# ----------------------------------------------- Connection extras (Airflow)


def test_connection_extras_reach_the_session(monkeypatch: pytest.MonkeyPatch, pki: Pki) -> None:
    import json

    from partner_harvest.airflow.connections import partner_endpoint

    monkeypatch.setenv("AIRFLOW_CONN_PARTNER_MUSEUM", json.dumps({
        "conn_type": "http", "host": "https://museum.example/oai",
        "extra": {"verify": str(pki.ca), "cert": [str(pki.client_pem), str(pki.client_pem)],
                  "proxies": {"https": "http://user:pw@proxy.example:3128"}},
    }))
    endpoint = partner_endpoint("partner_museum")
    assert "pw@" not in repr(endpoint)
    session = built(OaiAdapter, partner(), endpoint).client.session
    assert session.verify == str(pki.ca)
    assert session.cert == (str(pki.client_pem), str(pki.client_pem))
    assert session.proxies == {"https": "http://user:pw@proxy.example:3128"}
    assert isinstance(session, PartnerSession) and session.home == ("https", "museum.example", 443)


def test_connection_without_extras_verifies_with_the_system_cas(monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    from partner_harvest.airflow.connections import partner_endpoint

    monkeypatch.setenv("AIRFLOW_CONN_PARTNER_MUSEUM", json.dumps({"conn_type": "http", "host": "museum.example"}))
    session = built(OaiAdapter, partner(), partner_endpoint("partner_museum")).client.session
    assert session.verify is True and session.cert is None and session.proxies == {}


def test_bad_tls_extras_fail_as_configuration_errors(tmp_path: Path) -> None:
    for extra, fragment in [({"verify": "false"}, "refused"), ({"verify": str(tmp_path / "nope.pem")}, "does not exist"),
                            ({"cert": str(tmp_path / "nope.pem")}, "does not exist"),
                            ({"proxies": "http://proxy:3128"}, "must map a scheme")]:
        with pytest.raises(ConfigurationError, match=fragment):
            build_adapter(partner(), Endpoint("https://museum.example/oai", extra=extra))


def test_limits_are_checked_in_the_registry_options() -> None:
    for key, value in [("max_response_bytes", 0), ("request_deadline", -1), ("max_xml_nodes", "many")]:
        # a value of the wrong type the registry's schema refuses, a bad number the HTTP policy
        with pytest.raises((RegistryError, ConfigurationError), match=f"options.http.{key}"):
            build_adapter(partner(**{key: value}), Endpoint("https://museum.example/oai"))
