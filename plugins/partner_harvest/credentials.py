"""A partner's credentials: how its Connection's secret is sent, where, and that it is never shown.

The secret is always the Connection's password (Airflow masks it in task logs); the extras
say how it travels:

- a login (and no ``auth``, or ``auth: basic``): HTTP Basic, login and password;
- ``{"auth": "bearer"}``: ``Authorization: Bearer <password>``;
- ``{"auth": "header", "auth_header": "Token"}``: that header carries the password;
- ``{"auth": "query", "auth_param": "apikey"}``: ``apikey=<password>`` on every request,
  a continuation's too (OAI-PMH still sees verb and token only: the parameter is the
  endpoint's, not the protocol's).

The session (``transport.PartnerSession.send``) puts them on every request to the
partner's own origin and takes them off any other (a redirect, a URL the partner hands
us). Every form of every secret built here is remembered for the process, so that
:func:`redact` can take it out of anything on its way to a log line, an error, a
``harvest_runs`` row or an alert (request URLs of the query form carry it).
"""

from __future__ import annotations

import base64
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, quote_plus, unquote_plus, urlsplit, urlunsplit

if TYPE_CHECKING:
    import requests

KINDS = ("basic", "bearer", "header", "query")
MASK = "***"
# What a query credential may not be called: OAI-PMH's own arguments (the repository would
# read it as one) and what a continuation carries.
RESERVED_PARAMS = frozenset({"verb", "metadataPrefix", "from", "until", "set", "identifier", "resumptionToken"})
_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")  # an HTTP token (RFC 9110)
_SECRETS: set[str] = set()  # every form of every secret seen by this process, to redact
_LOCK = threading.Lock()


@dataclass(frozen=True)
class Credentials:
    """How one partner's requests carry its secret (``kind`` in :data:`KINDS`)."""

    kind: str
    secret: str = field(repr=False)
    login: str | None = None
    name: str | None = None  # the header's or the query parameter's name

    def __post_init__(self) -> None:
        remember(self.secret)
        if self.kind == "basic":
            remember(self._basic())

    def _basic(self) -> str:
        pair = f"{self.login or ''}:{self.secret}".encode()
        return base64.b64encode(pair).decode("ascii")

    @property
    def header(self) -> str | None:
        """The header that carries the secret (None: the query form)."""
        return {"basic": "Authorization", "bearer": "Authorization", "header": self.name}.get(self.kind)

    def describe(self) -> str:
        """How the secret is sent, for logs and docs: never the secret itself."""
        return {"basic": f"HTTP Basic as {self.login!r}", "bearer": "a Bearer token",
                "header": f"the header {self.name}", "query": f"the query parameter {self.name}"}[self.kind]

    def apply(self, request: requests.PreparedRequest) -> None:
        """Put the secret on a request to the partner's origin (replacing any copy of it)."""
        if self.kind == "query":
            request.url = _with_param(_without_param(request.url or "", self.name or ""), self.name or "", self.secret)
            return
        value = {"basic": f"Basic {self._basic()}", "bearer": f"Bearer {self.secret}"}.get(self.kind, self.secret)
        request.headers[self.header or "Authorization"] = value

    def withhold(self, request: requests.PreparedRequest) -> bool:
        """Take the secret off a request to another origin (its header or parameter, and any
        query value that is the secret: a redirect's Location may repeat it); True when there
        was one to take."""
        url = request.url or ""
        stripped = _without_param(url, self.name or "", self.secret)
        request.url = stripped
        header = self.header
        if header is not None and header in request.headers:
            del request.headers[header]
            return True
        return stripped != url


def from_connection(login: str | None, password: str | None, extra: Mapping[str, Any] | None) -> Credentials | None:
    """The credentials a Connection describes, or None (none asked for).

    ValueError names the extra key (or field) at fault; the message never holds the secret.
    """
    extra = extra or {}
    kind = str(extra.get("auth") or "").strip().lower() or None
    login = (login or "").strip() or None
    secret = password or None
    if kind is None:
        if login is None and secret is None:
            return None
        if login is None:
            raise ValueError("a password without a login: set extra 'auth' (bearer, header or query) to say how "
                             "the partner takes it, or a login for HTTP Basic")
        kind = "basic"
    if kind not in KINDS:
        raise ValueError(f"extra 'auth' must be one of {', '.join(KINDS)}, got {kind!r}")
    if secret is None:
        raise ValueError(f"extra 'auth' {kind}: the secret goes in the Connection's password, which is empty")
    if kind == "basic":
        if login is None:
            raise ValueError("extra 'auth' basic needs a login")
        return Credentials("basic", secret, login=login)
    if kind == "bearer":
        return Credentials("bearer", secret)
    key = "auth_header" if kind == "header" else "auth_param"
    name = str(extra.get(key) or "").strip()
    if not name:
        raise ValueError(f"extra 'auth' {kind} needs extra '{key}' (the name the partner expects)")
    if kind == "header":
        if not _HEADER_NAME.match(name):
            raise ValueError(f"extra 'auth_header' {name!r} is not an HTTP header name")
        if name.lower() in ("host", "content-length", "cookie"):
            raise ValueError(f"extra 'auth_header' {name!r} cannot carry a credential")
    elif name in RESERVED_PARAMS:
        raise ValueError(f"extra 'auth_param' {name!r} is an OAI-PMH argument; name the partner's own parameter")
    return Credentials(kind, secret, name=name)


def remember(secret: str) -> None:
    """Add a secret (and its URL-encoded forms) to what :func:`redact` takes out."""
    if not secret:
        return
    with _LOCK:
        _SECRETS.update(form for form in (secret, quote(secret, safe=""), quote_plus(secret)) if form)


def redact(text: str) -> str:
    """``text`` with every secret this process knows replaced by ``***`` (longest first)."""
    if not _SECRETS or not text:
        return text
    with _LOCK:
        secrets = sorted(_SECRETS, key=len, reverse=True)
    for secret in secrets:
        if secret in text:
            text = text.replace(secret, MASK)
    return text


def _split_query(url: str) -> tuple[tuple[str, str, str, str, str], list[str]]:
    parts = urlsplit(url)
    return (parts.scheme, parts.netloc, parts.path, parts.query, parts.fragment), \
        [segment for segment in parts.query.split("&") if segment]


def _without_param(url: str, name: str, secret: str | None = None) -> str:
    """The URL without any ``name=...`` segment, nor one whose value is ``secret`` (the others
    untouched, byte for byte)."""
    (scheme, netloc, path, query, fragment), segments = _split_query(url)
    kept = [s for s in segments if unquote_plus(s.partition("=")[0]) != name
            and (secret is None or unquote_plus(s.partition("=")[2]) != secret)]
    if len(kept) == len(segments):
        return url
    return urlunsplit((scheme, netloc, path, "&".join(kept), fragment))


def _with_param(url: str, name: str, value: str) -> str:
    (scheme, netloc, path, query, fragment), segments = _split_query(url)
    segments.append(f"{quote_plus(name)}={quote_plus(value)}")
    return urlunsplit((scheme, netloc, path, "&".join(segments), fragment))
