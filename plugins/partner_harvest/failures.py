"""Why a try failed, in a few words, and whether another try can help: one place decides.

The task wrapper (``airflow/tasks.py``) fails a try at once, without Airflow's retries,
when no retry can fix its error; the alerts, ``run_events``, the health page and
``partner-harvest status`` show the same short cause first ("connection refused at
host:port", "HTTP 503 from host") and the full text after it. :data:`RULES` are tried in
order, the first that matches decides; docs/operator/alerts.md's table of causes is
generated from them.
"""

from __future__ import annotations

import re
import ssl
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta

from partner_harvest.errors import ConfigurationError, HarvestError
from partner_harvest.registry import RegistryError
from partner_harvest.window import WindowError

# Airflow's retries of every partner task unless the registry says otherwise (the DAG factory's
# default_args): the first retry after 2 minutes, each wait twice the last, at most 30 minutes.
RETRY_DELAY = timedelta(minutes=2)
RETRY_BACKOFF = 2.0
MAX_RETRY_DELAY = timedelta(minutes=30)

SHORT_LIMIT = 120  # characters of the short cause
FULL_LIMIT = 2000  # characters of the full text kept (run_events.message's cap too)


@dataclass(frozen=True)
class Failure:
    """A failed try as the operator reads it."""

    short: str  # the cause in a few words: what the index, the alert's subject and `status` show
    full: str  # the whole error text, one line (the partner page, the alert's details, the log)
    retry: bool  # whether Airflow's retries may help
    rule: str  # the name of the rule that decided (docs/operator/alerts.md)


@dataclass(frozen=True)
class _Facts:
    """What the rules look at, gathered once from the exception and its chain."""

    chain: tuple[BaseException, ...]
    text: str  # the exception's own text, one line
    status: int | None  # an HTTP status the partner answered with
    host: str | None  # host:port of the partner's endpoint, when known

    def has(self, *names: str) -> bool:
        """An exception of a class with one of these names in the chain (or its bases)."""
        return any(klass.__name__ in names for exc in self.chain for klass in type(exc).__mro__)

    def of(self, kind: type[BaseException]) -> BaseException | None:
        return next((exc for exc in self.chain if isinstance(exc, kind)), None)

    def at(self) -> str:
        return f" at {self.host}" if self.host else ""

    def frm(self) -> str:
        return f" from {self.host.rsplit(':', 1)[0]}" if self.host else ""


@dataclass(frozen=True)
class Rule:
    name: str
    retry: bool
    meaning: str  # what it usually means (the docs' table)
    action: str  # what to do
    match: Callable[[_Facts], str | None]  # the short cause when the rule applies
    example: str = ""  # a short cause it gives (the docs' table)


def _cause(exc: BaseException | None) -> str:
    """A harvest error's own cause (without the partner and request around it)."""
    return exc.cause if isinstance(exc, HarvestError) else str(exc or "")


def _undefined_connection(f: _Facts) -> str | None:
    # The Task SDK's AirflowNotFoundException, by name: the library imports no Airflow.
    if f.has("AirflowNotFoundException"):
        found = re.search(r"conn_id `([^`]+)`", f.text)
        return f"Connection '{found.group(1)}' is not defined" if found else shorten(f.text)
    return None


def _unusable_connection(f: _Facts) -> str | None:
    error = f.of(ConfigurationError)
    if isinstance(error, ConfigurationError) and error.request.startswith("Connection"):
        return shorten(f"{error.request}: {error.cause}")
    return None


def _credentials(f: _Facts) -> str | None:
    if f.status in (401, 403):
        return f"HTTP {f.status}{f.frm()}: credentials refused"
    error = f.of(ConfigurationError)
    if error is not None and "credential" in _cause(error):
        return shorten(f"credentials refused{f.frm()}")
    return None


def _certificate(f: _Facts) -> str | None:
    if f.of(ssl.SSLCertVerificationError) is not None or f.has("SSLError"):
        reason = re.search(r"certificate verify failed: ([^()\"']+)", f.text)
        return shorten(f"certificate error{f.at()}" + (f": {reason.group(1).strip()}" if reason else ""))
    return None


def _registry(f: _Facts) -> str | None:
    error = f.of(RegistryError)
    return shorten(f"registry entry invalid: {error}") if error is not None else None


def _not_retryable(f: _Facts) -> str | None:
    error = f.of(HarvestError)
    if isinstance(error, HarvestError) and not error.retryable:
        return shorten(error.cause)
    error = f.of(WindowError)
    return shorten(str(error)) if error is not None else None


def _client_error(f: _Facts) -> str | None:
    if f.status is not None and 400 <= f.status < 500 and f.status not in (408, 425, 429):
        return f"HTTP {f.status}{f.frm()}: the request is refused as sent (wrong URL or parameters?)"
    return None


def _refused(f: _Facts) -> str | None:
    if f.of(ConnectionRefusedError) is not None or "connection refused" in f.text.lower():
        return f"connection refused{f.at()}"
    return None


def _name_unknown(f: _Facts) -> str | None:
    if f.has("NameResolutionError", "gaierror") or "Name or service not known" in f.text:
        return f"host not found: {f.host.rsplit(':', 1)[0]}" if f.host else "host not found"
    return None


def _timeout(f: _Facts) -> str | None:
    if f.has("Timeout", "TimeoutError", "ReadTimeoutError", "ConnectTimeoutError", "RequestDeadlineExceeded"):
        return f"timeout{f.at()}"
    return None


def _server_error(f: _Facts) -> str | None:
    if f.status is not None and (f.status >= 500 or f.status == 429):
        return f"HTTP {f.status}{f.frm()}"
    return None


def _token_expired(f: _Facts) -> str | None:
    found = re.search(r"resumptionToken expired (\d+) times", f.text)
    return f"token expired ({found.group(1)} restarts)" if found else None


def _database(f: _Facts) -> str | None:
    if f.has("OperationalError") and f.of(HarvestError) is None:
        return "aggregation database unreachable"
    return None


RULES: tuple[Rule, ...] = (
    Rule("Connection not defined", False, "the partner's (or `aggregation_db`'s) Connection does not exist",
         "create it (docs/operator/connections.md), then clear the task", _undefined_connection,
         "Connection 'partner_museum' is not defined"),
    Rule("Connection unusable", False, "the Connection is of the wrong type or its extras are invalid",
         "fix the Connection, then clear the task", _unusable_connection,
         "Connection 'partner_museum': is of type 'postgres'; ..."),
    Rule("credentials refused", False, "HTTP 401/403, or Sierra refused the client key and secret",
         "fix the login/password of the Connection (or ask the partner), then clear the task", _credentials,
         'HTTP 401 from museum.example: credentials refused'),
    Rule("certificate error", False, "TLS verification failed: an expired, self-signed or unknown certificate",
         "give the partner's CA bundle in the Connection's extra `verify`, or ask the partner to fix its "
         "certificate; then clear the task", _certificate,
         'certificate error at museum.example:443: self-signed certificate'),
    Rule("registry entry invalid", False, "the partner's registry entry is invalid",
         "fix the entry (`partner-harvest validate` names the field)", _registry,
         'registry entry invalid: ...'),
    Rule("not retryable", False, "an error a retry meets again: a pagination loop, a cap of the registry, "
         "a window that cannot be frozen, an operator's command during the run",
         "read the cause; tell the partner (loops) or raise the cap; then clear the task", _not_retryable,
         'the partner returned the resumptionToken ... a second time'),
    Rule("request refused", False, "HTTP 4xx (not 401/403/408/429): the URL is wrong (a wrong Connection "
         "host) or the partner refuses the request as sent", "check the Connection's host; then clear the task",
         _client_error,
         'HTTP 404 from museum.example: the request is refused as sent (wrong URL or parameters?)'),
    Rule("connection refused", True, "nothing listens at the partner's host and port: the server is down",
         "nothing while it retries; if the final try fails, clear the task once the partner is back", _refused,
         'connection refused at museum.example:443'),
    Rule("host not found", True, "the partner's host name does not resolve (DNS down, or a wrong host)",
         "check the Connection's host; retried", _name_unknown,
         'host not found: museum.example'),
    Rule("timeout", True, "the partner did not answer in time (connect_timeout, read_timeout, request_deadline)",
         "nothing while it retries; a partner that is always slow needs longer timeouts in options.http",
         _timeout,
         'timeout at museum.example:443'),
    Rule("server error", True, "HTTP 5xx or 429 after the transport's own retries: down or throttling",
         "nothing while it retries; clear the task once the partner is back", _server_error,
         'HTTP 503 from museum.example'),
    Rule("token expired", True, "resumptionTokens expire faster than the harvest pages",
         "raise `max_token_restarts`, or ask the partner for longer token lifetimes", _token_expired,
         'token expired (4 restarts)'),
    Rule("database unreachable", True, "the aggregation database did not answer",
         "check the database; retried", _database,
         'aggregation database unreachable'),
)
OTHER = Rule("other", True, "anything else (broken or hostile XML, an OAI-PMH error, a lease held by another run)",
             "read the full cause on the partner's page or in the task's log", lambda f: shorten(f.text),
             "unusable response: not XML ...")


def classify(exc: BaseException) -> Failure:
    """The try's failure: its short cause, its full text and whether a retry may help."""
    facts = _facts(exc)
    for rule in (*RULES, OTHER):
        short = rule.match(facts)
        if short:
            return Failure(short, shorten(facts.text, FULL_LIMIT), rule.retry, rule.name)
    return Failure(type(exc).__name__, type(exc).__name__, True, OTHER.name)  # an exception without text


def shorten(text: str, limit: int = SHORT_LIMIT) -> str:
    """One line, cut at a word boundary (never mid-word) with an ellipsis when longer than ``limit``."""
    line = " ".join(str(text).split())
    if len(line) <= limit:
        return line
    cut = line[: limit - 1]
    space = cut.rfind(" ")
    return (cut[:space] if space > limit // 2 else cut).rstrip(" ,;:(") + "…"


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """The exception, its causes and contexts, and the exceptions it carries (urllib3's reason)."""
    seen: set[int] = set()
    todo = [exc]
    while todo:
        current = todo.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        carried = [current.__cause__, current.__context__, getattr(current, "reason", None),
                   *(a for a in current.args if isinstance(a, BaseException))]
        todo += [c for c in carried if isinstance(c, BaseException)]


def _facts(exc: BaseException) -> _Facts:
    chain = tuple(_chain(exc))
    text = " ".join(str(exc).split()) or type(exc).__name__
    status = None
    for error in chain:
        response = getattr(error, "response", None)
        code = getattr(response, "status_code", None)
        if isinstance(code, int):
            status = code
            break
        found = re.match(r"(?:.*?: )?HTTP (\d{3})\b", _cause(error)) if isinstance(error, HarvestError) else None
        if found:
            status = int(found.group(1))
            break
    return _Facts(chain, text, status, _host(chain))


def _host(chain: tuple[BaseException, ...]) -> str | None:
    """host:port of the request: urllib3's pool, else the URL a harvest error names."""
    for error in chain:
        host, port = getattr(getattr(error, "pool", None), "host", None), getattr(getattr(error, "pool", None), "port", None)
        if host:
            return f"{host}:{port}" if port else str(host)
    for error in chain:
        request = error.request if isinstance(error, HarvestError) else ""
        found = re.search(r"\b(https?)://(?:[^@/\s]*@)?([^/?#\s:]+)(?::(\d+))?", request)
        if found:
            scheme, host, port = found.groups()
            return f"{host}:{port or (443 if scheme == 'https' else 80)}"
    return None


def retry_wait(delay: timedelta, multiplier: float, cap: timedelta | None, try_number: int) -> tuple[timedelta, timedelta]:
    """The wait before the try after ``try_number`` fails, as Airflow 3 computes it: the
    ``retry_delay`` times ``retry_exponential_backoff`` ** (try_number - 1), then a point between
    that and twice that (fixed per task instance), at most ``max_retry_delay``. (low, high)."""
    if multiplier in (0, 1) or multiplier < 0:
        return delay, delay
    low = max(1.0, float(int(-(-delay.total_seconds() * multiplier ** (try_number - 1) // 1))))
    bounds = [timedelta(seconds=low), timedelta(seconds=2 * low - 1)]
    if cap:
        bounds = [min(cap, b) for b in bounds]
    return bounds[0], bounds[1]


def transport_wait(retries: int, backoff_factor: float, backoff_max: float) -> float:
    """Seconds one request sleeps between its transport retries when every attempt fails at
    once (a refused connection), as urllib3 2 backs off: nothing before the first retry,
    then ``backoff_factor`` * 2 ** (n - 1) before the n-th, at most ``backoff_max``; without
    the jitter of up to half a second each and without any timeout waited."""
    return sum(0.0 if n <= 1 else min(backoff_max, backoff_factor * 2 ** (n - 1)) for n in range(1, retries + 1))
