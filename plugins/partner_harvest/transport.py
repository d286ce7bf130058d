"""One configured ``requests.Session`` per partner: timeouts, retries, limits, credentials.

Partners throttle with 503/429 and ``Retry-After`` (seconds or an HTTP-date); some send a
day. We honour it up to a cap, back off exponentially otherwise, and log every retry
with the partner's name so an operator can see why a run is slow.

A partner's server is outside our control, so the session also bounds what it can do to
a worker (see the README, "What a partner cannot do to you"):

- every body is read streaming, and at most ``max_response_bytes`` *decoded* bytes are
  kept (a small gzip can expand to gigabytes; a body can be endless);
- every request ends within ``request_deadline`` seconds of talking to the server, even
  when the server drips one byte at a time (which never trips a read timeout);
- credentials (the Connection's, ``credentials.py``: Basic, Bearer, a header or a query
  parameter) go on every request to the partner's origin (scheme, host and port) and never
  leave it: not on a redirect, not on a URL the partner hands us; a URL printed anywhere
  is redacted;
- TLS is verified; a partner's own CA bundle, client certificate or proxy come from its
  Connection's extras (:class:`Transport`), never from code.
"""

from __future__ import annotations

import http.client
import io
import logging
import os
import re
import socket
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from types import TracebackType
from typing import Annotated, Any, Protocol
from urllib.parse import urlsplit

import requests
from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, field_serializer, field_validator
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import ConnectionPool, HTTPConnectionPool, HTTPSConnectionPool
from urllib3.response import BaseHTTPResponse
from urllib3.util.retry import Retry

from partner_harvest.credentials import Credentials, redact
from partner_harvest.errors import HarvestError, PartnerAsksToWait, PartnerHttpError

log = logging.getLogger(__name__)

RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
USER_AGENT = "partner-harvest/0.1 (+aggregator; OAI-PMH and Sierra harvester)"
MiB = 1024 * 1024
READ_CHUNK = 64 * 1024  # decoded bytes per read: urllib3 >= 2.6 inflates no more than asked


_Seconds = Annotated[float, Field(strict=True)]


class HttpPolicy(BaseModel):
    """How patient, and how trusting, to be with one partner (registry ``options.http``).

    A pydantic model: the registry validates ``options.http`` into this very object, so
    each default and each rule lives here once. Strict: YAML ``'5'`` or ``yes`` is no number.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, title="options.http")

    connect_timeout: Annotated[_Seconds, Field(gt=0, description=(
        "seconds to wait for the partner's server to accept the connection"))] = 10.0
    read_timeout: Annotated[_Seconds, Field(gt=0, description=(
        "seconds to wait for the next bytes of a response"))] = 120.0
    retries: Annotated[StrictInt, Field(ge=0, description=(
        "retries of one request by the transport (statuses in retry_statuses, broken connections, "
        "timeouts), with exponential backoff"))] = 5
    backoff_factor: Annotated[_Seconds, Field(ge=0, description=(
        "the first retry's backoff in seconds, doubling after each"))] = 2.0
    backoff_max: Annotated[_Seconds, Field(ge=0, description="the longest backoff between two retries, in seconds")] = 120.0
    retry_after_cap: Annotated[_Seconds, Field(ge=0, description=(
        "a Retry-After longer than this many seconds is cut to it"))] = 300.0
    max_wait_in_task: Annotated[_Seconds, Field(ge=0, description=(
        "a Retry-After up to this many seconds is slept in the task (an OAI-PMH token chain lives on); "
        "a longer one ends the request and the task gives its worker slot back until then (a reschedule) "
        "instead of holding it asleep"))] = 60.0
    user_agent: Annotated[StrictStr, Field(min_length=1, description="the User-Agent header sent")] = USER_AGENT
    retry_statuses: frozenset[StrictInt] = Field(default=RETRY_STATUSES, description=(
        "HTTP statuses the transport retries; default 429, 500, 502, 503, 504, and for Sierra 502, 503, 504 "
        "(the Sierra client reads 500 and 429 itself: their bodies and waits carry Sierra's codes)"))
    max_response_bytes: Annotated[StrictInt, Field(ge=1, description=(
        "decoded bytes of one response body kept at most (a small gzip can expand to gigabytes); the "
        "largest honest page known (2,000 rich MARCXML/LIDO records) is well below the default"))] = 64 * MiB
    request_deadline: Annotated[_Seconds, Field(gt=0, description=(
        "seconds one request may spend talking to the server, redirects included, the waits between the "
        "transport's retries excluded (retries x retry_after_cap bound those); a server dripping one byte "
        "at a time never trips read_timeout but trips this"))] = 600.0
    max_xml_nodes: Annotated[StrictInt, Field(ge=1, description=(
        "libxml2 nodes of one XML page, counted before parsing (about 250 MB of tree); honest pages hold "
        "one per ~20 bytes, so raise it with max_response_bytes past 40 MiB"))] = 2_000_000

    @field_validator("retry_statuses", mode="before")
    @classmethod
    def _statuses(cls, value: object) -> object:
        """A YAML list of statuses is a set here."""
        return frozenset(value) if isinstance(value, (list, tuple, set)) else value

    @field_serializer("retry_statuses", when_used="json")
    def _statuses_json(self, value: frozenset[int]) -> list[int]:
        return sorted(value)


# --------------------------------------------------------------------------- errors


class ResponseTooLarge(requests.RequestException):
    """The body grew past the partner's cap on decoded bytes; reading stopped there."""


class RequestDeadlineExceeded(requests.Timeout):
    """The request did not complete within the partner's total deadline."""


class ServerAsksToWait(Exception):
    """The server asked for a wait longer than the task may sleep (``max_wait_in_task``).

    Raised by :class:`CappedRetry` instead of sleeping; the protocol clients turn it into
    PartnerAsksToWait (OAI-PMH) or RateLimited (Sierra), which free the worker slot. Not an
    OSError, so neither urllib3 nor requests retries or wraps it.
    """

    def __init__(self, seconds: float, status: int):
        super().__init__(f"HTTP {status} with Retry-After {seconds:g} s")
        self.seconds = seconds
        self.status = status


@contextmanager
def partner_request(
    partner_id: str, request: str, asks_to_wait: Callable[[ServerAsksToWait], HarvestError] | None = None,
) -> Iterator[None]:
    """Turns what the transport raises into the harvest's errors, naming partner and request.

    A wait longer than a task may sleep becomes :class:`PartnerAsksToWait` (or what
    ``asks_to_wait`` makes of it), which frees the worker slot; any other failure left after
    the retries becomes :class:`PartnerHttpError`.
    """
    try:
        yield
    except ServerAsksToWait as exc:
        if asks_to_wait is not None:
            raise asks_to_wait(exc) from None
        raise PartnerAsksToWait(partner_id, request, f"{exc}, longer than a task may sleep "
                                "(options.http.max_wait_in_task)",
                                datetime.now(timezone.utc) + timedelta(seconds=exc.seconds)) from None
    except requests.RequestException as exc:
        cause = f"{type(exc).__name__}: {exc}"
        if redact(cause) != cause:  # a URL with the query credential: keep it out of tracebacks too
            raise PartnerHttpError(partner_id, request, cause) from None
        raise PartnerHttpError(partner_id, request, cause) from exc


class _DeadlinePassed(Exception):
    """Raised inside urllib3 on purpose: not an OSError/TimeoutError, so never retried."""


# ------------------------------------------------------------------------- deadline


class _Deadline:
    """A moving end: waiting politely between retries does not count against it."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.at = time.monotonic() + seconds

    def remaining(self) -> float:
        return self.at - time.monotonic()

    def extend(self, seconds: float) -> None:
        self.at += seconds


_DEADLINE: ContextVar[_Deadline | None] = ContextVar("partner_http_deadline", default=None)


class _DeadlineReader(io.RawIOBase):
    """The socket reader under http.client: no single recv may outlive the deadline.

    A read timeout bounds the gap between bytes; a server that sends one byte every few
    seconds never trips it. Here every recv waits at most until the deadline.
    """

    def __init__(self, raw: io.RawIOBase, sock: socket.socket, deadline: _Deadline):
        super().__init__()
        self._raw = raw
        self._sock = sock
        self._deadline = deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int | None:
        remaining = self._deadline.remaining()
        if remaining <= 0:
            raise _DeadlinePassed()
        timeout = self._sock.gettimeout()
        self._sock.settimeout(remaining if timeout is None else min(timeout, remaining))
        try:
            return self._raw.readinto(buffer)
        except TimeoutError:
            if self._deadline.remaining() <= 0:
                raise _DeadlinePassed() from None
            raise
        finally:
            self._sock.settimeout(timeout)

    def fileno(self) -> int:
        return self._raw.fileno()

    def close(self) -> None:
        if not self.closed:
            self._raw.close()
        super().close()


class _DeadlineResponse(http.client.HTTPResponse):
    """http.client's response reading through a :class:`_DeadlineReader` when one is set."""

    def __init__(self, sock: socket.socket, *args: Any, **kwargs: Any):
        super().__init__(sock, *args, **kwargs)
        deadline = _DEADLINE.get()
        if deadline is not None and isinstance(self.fp, io.BufferedReader):
            raw = self.fp.detach()  # detach: the old reader must not close the socket file
            self.fp = io.BufferedReader(_DeadlineReader(raw, sock, deadline))


# ------------------------------------------------------------------------- pacing


class RequestPacer(Protocol):
    """Politeness around each request on the wire (``politeness.Pacer``): retries included."""

    def before(self) -> float:
        """Wait for the request's slot at its host; the seconds waited."""
        ...

    def after(self, seconds: float, status: int | None) -> None:
        """The response's headers came after ``seconds`` (``status`` None: the request failed)."""
        ...

    def judged_by_caller(self) -> AbstractContextManager[None]:
        """A block whose strained answers wait for the caller's reading of their body."""
        ...

    def excuse(self) -> None:
        """The answer just read was about a record (its body said so), not strain on the host."""
        ...

    def close(self) -> None:
        """The session is done: give back what the pacing holds (a database connection)."""
        ...


_PACER: ContextVar[RequestPacer | None] = ContextVar("partner_http_pacer", default=None)


# A request on a reused connection that fails this way before any answer met a connection
# the server had closed (its idle keep-alive timeout passed): urllib3 sends it again on a new one.
_STALE_CONNECTION_ERRORS = (ConnectionError,)  # RemoteDisconnected, resets, broken pipes
_KEEP_ALIVE_TIMEOUT = re.compile(r"(?:^|[,;\s])timeout\s*=\s*(\d+)", re.IGNORECASE)


def keep_alive_timeout(header: str | None) -> float | None:
    """The idle timeout a server announces (``Keep-Alive: timeout=5, max=100``), or None."""
    match = _KEEP_ALIVE_TIMEOUT.search(header or "")
    return float(match.group(1)) if match else None


class _Paced:
    """A connection that reports how the host answered each request to the pacer, and knows
    how long its server keeps it open while idle (the ``Keep-Alive`` header).

    The wait for the request's pacing slot happens in the pool (:class:`_PacedPool`), before
    a connection is handed out: a connection the server closed during the wait is then seen
    closed and replaced, instead of carrying the request into a reset. A request that still
    meets a closed connection (sent just as the server closed it) is no strain on the host:
    urllib3 sends it again at once on a new connection, whose answer is what counts.
    """

    _pace_started: float | None = None
    _answered_on: object = None  # the socket of the last response: a request sent on it reuses it
    _reused = False
    keep_alive: float | None = None  # the idle timeout the server announced on its last response
    idle_since: float | None = None  # when the connection went back to the pool

    def request(self, *args: Any, **kwargs: Any) -> None:
        self._reused = self.sock is not None and self.sock is self._answered_on  # type: ignore[attr-defined]
        if _PACER.get() is not None:
            self._pace_started = time.monotonic()
        try:
            super().request(*args, **kwargs)  # type: ignore[misc]
        except BaseException as exc:
            self._report(None, exc)
            raise

    def getresponse(self) -> Any:
        try:
            response = super().getresponse()  # type: ignore[misc]
        except BaseException as exc:
            self._report(None, exc)
            raise
        self._answered_on = self.sock  # type: ignore[attr-defined]
        self.keep_alive = keep_alive_timeout(response.headers.get("Keep-Alive"))
        self._report(response.status)
        return response

    def idle_expired(self) -> bool:
        """Idle so long that its server has closed it, or is about to (its announced timeout,
        less a second for the request's way there)."""
        if self.keep_alive is None or self.idle_since is None:
            return False
        return time.monotonic() - self.idle_since >= max(self.keep_alive - 1.0, self.keep_alive / 2)

    def _report(self, status: int | None, error: BaseException | None = None) -> None:
        started, self._pace_started = self._pace_started, None
        pacer = _PACER.get()
        if started is None or pacer is None:
            return
        if status is None and self._reused and isinstance(error, _STALE_CONNECTION_ERRORS):
            log.info("%s: the server had closed the pooled connection (%s); the request goes again on a new one",
                     getattr(pacer, "partner_id", "partner"), type(error).__name__)
            return
        pacer.after(time.monotonic() - started, status)


class _HTTPConnection(_Paced, HTTPConnection):
    response_class = _DeadlineResponse


class _HTTPSConnection(_Paced, HTTPSConnection):
    response_class = _DeadlineResponse


class _PacedPool:
    """A pool whose requests wait for their pacing slot before a connection is handed out
    (urllib3 then sees whether the server closed it meanwhile), and that drops a connection
    idle past its server's announced keep-alive timeout before using it again."""

    def _get_conn(self, timeout: float | None = None) -> Any:
        pacer = _PACER.get()
        if pacer is not None:
            waited = pacer.before()
            deadline = _DEADLINE.get()
            if deadline is not None and waited:
                deadline.extend(waited)  # waiting for the slot is politeness, not the server's time
        conn = super()._get_conn(timeout)  # type: ignore[misc]
        if isinstance(conn, _Paced) and conn.idle_expired():
            conn.close()  # type: ignore[attr-defined]  # as urllib3 does with a dropped one: the request connects anew
        return conn

    def _put_conn(self, conn: Any) -> None:
        if isinstance(conn, _Paced):
            conn.idle_since = time.monotonic()
        super()._put_conn(conn)  # type: ignore[misc]


class PartnerHTTPConnectionPool(_PacedPool, HTTPConnectionPool):
    """urllib3's pool, paced, with connections whose responses read through the deadline."""

    ConnectionCls = _HTTPConnection


class PartnerHTTPSConnectionPool(_PacedPool, HTTPSConnectionPool):
    ConnectionCls = _HTTPSConnection


_POOL_CLASSES = {"http": PartnerHTTPConnectionPool, "https": PartnerHTTPSConnectionPool}


# ---------------------------------------------------------------------- retries


class CappedRetry(Retry):
    """urllib3 Retry that caps Retry-After and names the partner in its log lines."""

    def __init__(self, *args: Any, retry_after_cap: float = 300.0, max_wait_in_task: float = 60.0,
                 label: str = "", **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.retry_after_cap = retry_after_cap
        self.max_wait_in_task = max_wait_in_task
        self.label = label

    def new(self, **kw: Any) -> CappedRetry:
        kw.setdefault("retry_after_cap", self.retry_after_cap)
        kw.setdefault("max_wait_in_task", self.max_wait_in_task)
        kw.setdefault("label", self.label)
        return super().new(**kw)

    def parse_retry_after(self, retry_after: str) -> float:
        return min(super().parse_retry_after(retry_after), self.retry_after_cap)

    def is_retry(self, method: str, status_code: int, has_retry_after: bool = False) -> bool:
        """A policy without 429 (Sierra's) hands 429 to its client: urllib3 would sleep its Retry-After."""
        if status_code == 429 and 429 not in (self.status_forcelist or ()):
            return False
        return super().is_retry(method, status_code, has_retry_after)

    def _asked_beyond_task(self, response: Any) -> float | None:
        """The response's Retry-After when it is longer than a task may sleep, else None."""
        asked = self.get_retry_after(response) if response is not None else None
        return asked if asked is not None and asked > self.max_wait_in_task else None

    def sleep(self, response: Any = None) -> None:
        """Wait as told; the wait does not count against the request's deadline. A
        Retry-After longer than ``max_wait_in_task`` is not slept: ServerAsksToWait."""
        beyond = self._asked_beyond_task(response)
        if beyond is not None:
            raise ServerAsksToWait(beyond, response.status)
        deadline = _DEADLINE.get()
        started = time.monotonic()
        try:
            super().sleep(response)
        finally:
            if deadline is not None:
                deadline.extend(time.monotonic() - started)

    def increment(
        self,
        method: str | None = None,
        url: str | None = None,
        response: BaseHTTPResponse | None = None,
        error: Exception | None = None,
        _pool: ConnectionPool | None = None,
        _stacktrace: TracebackType | None = None,
    ) -> CappedRetry:
        new = super().increment(method, url, response, error, _pool, _stacktrace)
        cause = f"HTTP {response.status}" if response is not None else f"{type(error).__name__}: {error}"
        beyond = self._asked_beyond_task(response)
        if beyond is not None:  # sleep() raises ServerAsksToWait
            log.warning("%s: %s %s failed (%s); the server asks for a wait of %.0f s, longer than a task may "
                        "sleep (options.http.max_wait_in_task = %g s)", self.label or "partner", method,
                        redact(url or ""), redact(cause), beyond, self.max_wait_in_task)
            return new
        asked = new.get_retry_after(response) if response is not None else None
        wait = asked if asked is not None else new.get_backoff_time()
        done = len(new.history)
        # ``total`` counts the retries left, so the configured number is what was used plus that.
        allowed = done + new.total if isinstance(new.total, int) else None
        log.warning(
            "%s: %s %s failed (%s); retry %d of %s in %.1fs",
            self.label or "partner", method, redact(url or ""), redact(cause), done,
            allowed if allowed is not None else "?", wait,
        )
        return new


class _OneLinePerRetry(logging.Filter):
    """urllib3 logs its own "Retrying (...) after connection broken" line for every retry
    that :meth:`CappedRetry.increment` already logged (with the partner's name): drop
    urllib3's, for our retries only."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        return not (str(record.msg).startswith("Retrying (") and args and isinstance(args[0], CappedRetry))


class _NoSecrets(logging.Filter):
    """urllib3 logs request URLs (at DEBUG): a query credential's secret becomes ***."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        shown = redact(message)
        if shown != message:
            record.msg, record.args = shown, None
        return True


logging.getLogger("urllib3.connectionpool").addFilter(_OneLinePerRetry())
for _name in ("urllib3.connectionpool", "urllib3.util.retry"):
    logging.getLogger(_name).addFilter(_NoSecrets())


# ------------------------------------------------------------------------ transport


@dataclass(frozen=True)
class Transport:
    """TLS and proxy settings of one partner, from its Connection's extras.

    The keys are those of Airflow's HTTP connection: ``verify`` (``true``, or the path
    of the partner's CA bundle), ``cert`` (a PEM with certificate and key, or
    ``[cert, key]``) and ``proxies`` (``{"https": "http://proxy:3128"}``). Switching
    verification off is refused: give the partner's CA bundle instead.
    """

    verify: bool | str = True
    cert: str | tuple[str, str] | None = None
    proxies: Mapping[str, str] = field(default_factory=dict, repr=False)  # may hold proxy credentials

    @classmethod
    def from_extra(cls, extra: Mapping[str, Any] | None) -> Transport:
        """Read and check the extras; ValueError names the extra key at fault."""
        extra = extra or {}
        verify = _verify_setting(extra.get("verify", True))
        cert = _cert_setting(extra.get("cert"))
        proxies = extra.get("proxies") or {}
        if not isinstance(proxies, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in proxies.items()
        ):
            raise ValueError("extra 'proxies' must map a scheme to a proxy URL, e.g. {\"https\": \"http://proxy:3128\"}")
        return cls(verify=verify, cert=cert, proxies=dict(proxies))


def _verify_setting(value: Any) -> bool | str:
    if isinstance(value, str) and value.strip().lower() in ("true", "1", "yes"):
        value = True
    if value is True:
        return True
    if not value or (isinstance(value, str) and value.strip().lower() in ("false", "0", "no", "off")):
        raise ValueError(
            "extra 'verify' switches TLS verification off, which is refused: a partner with "
            "its own CA gives the path of its CA bundle as 'verify'"
        )
    if not isinstance(value, str):
        raise ValueError(f"extra 'verify' must be true or the path of a CA bundle, got {type(value).__name__}")
    if not os.path.exists(value):
        raise ValueError(f"extra 'verify': CA bundle {value!r} does not exist on this worker")
    return value


def _cert_setting(value: Any) -> str | tuple[str, str] | None:
    if value in (None, ""):
        return None
    paths = [value] if isinstance(value, str) else value
    if not isinstance(paths, (list, tuple)) or len(paths) not in (1, 2) or not all(isinstance(p, str) for p in paths):
        raise ValueError("extra 'cert' must be the path of a PEM (certificate and key) or [certificate, key]")
    for path in paths:
        if not os.path.isfile(path):
            raise ValueError(f"extra 'cert': {path!r} does not exist on this worker")
    return paths[0] if len(paths) == 1 else (paths[0], paths[1])


# -------------------------------------------------------------------------- origins


def origin(url: str) -> tuple[str, str, int | None]:
    """(scheme, host, port) with the scheme's default port filled in."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    port = parts.port or {"http": 80, "https": 443}.get(scheme)
    return scheme, (parts.hostname or "").lower(), port


def _show(o: tuple[str, str, int | None]) -> str:
    return f"{o[0]}://{o[1]}:{o[2]}"


# ------------------------------------------------------------------ adapter, session


class PartnerAdapter(HTTPAdapter):
    """Reads every body (redirects included) streaming, up to a cap on decoded bytes."""

    def __init__(self, label: str, max_response_bytes: int, *, pool_maxsize: int, **kwargs: Any):
        self.label = label
        self.max_response_bytes = max_response_bytes
        self.pool_maxsize = pool_maxsize  # connections kept open per host (widen)
        super().__init__(pool_maxsize=pool_maxsize, **kwargs)

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = _POOL_CLASSES

    def proxy_manager_for(self, proxy: str, **proxy_kwargs: Any) -> Any:
        manager = super().proxy_manager_for(proxy, **proxy_kwargs)
        if not proxy.lower().startswith("socks"):  # SOCKS managers have pools of their own
            manager.pool_classes_by_scheme = _POOL_CLASSES
        return manager

    def send(self, request: requests.PreparedRequest, stream: bool = False, **kwargs: Any) -> requests.Response:  # type: ignore[override]
        response = super().send(request, stream=True, **kwargs)
        try:
            self._read_body(response)
        except BaseException:
            response.close()  # never drain a hostile body to reuse the connection
            raise
        return response

    def _read_body(self, response: requests.Response) -> None:
        cap = self.max_response_bytes
        declared = response.headers.get("Content-Length", "")
        if not response.headers.get("Content-Encoding") and declared.isdigit() and int(declared) > cap:
            raise self._too_large(response, f"it announces {int(declared):,} bytes")
        body = io.BytesIO()
        size = 0
        for chunk in response.iter_content(READ_CHUNK):
            size += len(chunk)
            if size > cap:
                raise self._too_large(response, f"stopped reading after {size:,} bytes")
            body.write(chunk)
        response._content = body.getvalue()
        response._content_consumed = True  # type: ignore[attr-defined]

    def _too_large(self, response: requests.Response, detail: str) -> ResponseTooLarge:
        cap = self.max_response_bytes
        log.warning("%s: response to %s %s exceeds %d bytes", self.label, response.request.method,
                    redact(response.request.url or ""), cap)
        return ResponseTooLarge(
            f"the response body exceeds the cap of {cap:,} bytes ({cap / MiB:g} MiB) after decoding "
            f"(options.http.max_response_bytes); {detail}",
            response=response, request=response.request,
        )


class PartnerSession(requests.Session):
    """A Session bound to one partner: timeouts, a deadline, TLS, and no credential leaks.

    ``home`` is the partner's base URL: ``credentials`` (and any ``Authorization`` header)
    are only ever sent to its origin; anywhere else, including every redirect that changes
    scheme, host or port, they are removed before the request leaves. Without ``home`` no
    credential is sent at all.
    """

    def __init__(
        self,
        timeout: tuple[float, float],
        *,
        label: str = "",
        home: str | None = None,
        deadline: float | None = None,
        transport: Transport | None = None,
        pacer: RequestPacer | None = None,
        credentials: Credentials | None = None,
    ):
        super().__init__()
        self.credentials = credentials
        self.pacer = pacer  # politeness at the partner's host (politeness.Pacer), or none
        self.default_timeout = timeout
        self.label = label
        self.home = origin(home) if home else None
        self.deadline = deadline
        self.transport = transport or Transport()
        self.verify = self.transport.verify
        self.cert = self.transport.cert
        self.proxies = dict(self.transport.proxies)

    def request(self, method: str, url: str, **kwargs: Any) -> requests.Response:  # type: ignore[override]
        kwargs.setdefault("timeout", self.default_timeout)
        # Per request, so that REQUESTS_CA_BUNDLE or HTTPS_PROXY never override a partner's own.
        if self.transport.verify is not True:
            kwargs.setdefault("verify", self.transport.verify)
        if self.transport.proxies:
            kwargs.setdefault("proxies", dict(self.transport.proxies))
        with self._deadline() as deadline, self._pacing():
            try:
                return super().request(method, url, **kwargs)
            except _DeadlinePassed:
                assert deadline is not None
                raise RequestDeadlineExceeded(
                    f"no complete response within the request deadline of {deadline.seconds:g} s "
                    "(options.http.request_deadline); the server was still sending"
                ) from None

    @contextmanager
    def _deadline(self) -> Iterator[_Deadline | None]:
        deadline = _Deadline(self.deadline) if self.deadline else None
        token = _DEADLINE.set(deadline)
        try:
            yield deadline
        finally:
            _DEADLINE.reset(token)

    @contextmanager
    def _pacing(self) -> Iterator[None]:
        token = _PACER.set(self.pacer)
        try:
            yield
        finally:
            _PACER.reset(token)

    def close(self) -> None:
        super().close()
        if self.pacer is not None:
            self.pacer.close()

    def send(self, request: requests.PreparedRequest, **kwargs: Any) -> requests.Response:
        """Every hop passes here: credentials go to the partner's origin and nowhere else."""
        if self.home is None:  # an origin unknown: the session's own credentials are never sent
            return super().send(request, **kwargs)
        target = origin(request.url or "")
        if target == self.home:
            if self.credentials is not None:
                self.credentials.apply(request)
        else:
            withheld = "Authorization" in request.headers
            if withheld:
                del request.headers["Authorization"]
            if self.credentials is not None:
                withheld = self.credentials.withhold(request) or withheld
            if withheld:
                log.warning("%s: credentials withheld from %s (not the partner's origin %s)",
                            self.label or "partner", _show(target), _show(self.home))
        return super().send(request, **kwargs)

    def should_strip_auth(self, old_url: str, new_url: str) -> bool:
        """Strict: any change of scheme, host or port drops credentials (even http->https)."""
        return origin(old_url) != origin(new_url)

    def rebuild_auth(self, prepared_request: requests.PreparedRequest, response: requests.Response) -> None:
        """Strip credentials on a cross-origin redirect; never pick new ones up from .netrc."""
        if "Authorization" in prepared_request.headers and self.should_strip_auth(
            response.request.url or "", prepared_request.url or ""
        ):
            del prepared_request.headers["Authorization"]


def widen(session: requests.Session, connections: int) -> None:
    """Keep at least ``connections`` connections to the partner open, for a client that sends
    that many requests at once (OAI-PMH GetRecords, a plan's probes): a smaller pool discards
    one after each request. A pool already that wide is kept as it is, open connections and all."""
    for prefix, adapter in list(session.adapters.items()):
        if isinstance(adapter, PartnerAdapter) and connections > adapter.pool_maxsize:
            session.mount(prefix, PartnerAdapter(adapter.label, adapter.max_response_bytes, max_retries=adapter.max_retries,
                                                 pool_connections=1, pool_maxsize=connections))


def build_session(
    label: str,
    policy: HttpPolicy | None = None,
    *,
    home: str | None = None,
    transport: Transport | None = None,
    pacer: RequestPacer | None = None,
    credentials: Credentials | None = None,
) -> PartnerSession:
    """A session for one partner's harvest: gzip accepted, retries with backoff, limits;
    ``credentials`` on every request to ``home``'s origin (credentials.py)."""
    policy = policy or HttpPolicy()
    retry = CappedRetry(
        total=policy.retries,
        connect=policy.retries,
        read=policy.retries,
        status=policy.retries,
        status_forcelist=policy.retry_statuses,
        allowed_methods=frozenset({"GET", "HEAD", "POST", "DELETE"}),
        backoff_factor=policy.backoff_factor,
        backoff_max=policy.backoff_max,
        backoff_jitter=0.5,
        respect_retry_after_header=True,
        raise_on_status=False,
        retry_after_cap=policy.retry_after_cap,
        max_wait_in_task=policy.max_wait_in_task,
        label=label,
    )
    session = PartnerSession(
        (policy.connect_timeout, policy.read_timeout), label=label, home=home,
        deadline=policy.request_deadline, transport=transport, pacer=pacer, credentials=credentials,
    )
    adapter = PartnerAdapter(label, policy.max_response_bytes, max_retries=retry, pool_connections=1, pool_maxsize=2)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    session.headers.update({"User-Agent": policy.user_agent, "Accept-Encoding": "gzip, deflate"})
    return session
