"""One configured ``requests.Session`` per harvest: timeouts, retries, Retry-After.

Partners throttle with 503/429 and ``Retry-After`` (seconds or an HTTP-date); some send a
day. We honour it up to a cap, back off exponentially otherwise, and log every retry
with the partner's name so an operator can see why a run is slow.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import requests
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry

log = logging.getLogger(__name__)

RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
USER_AGENT = "partner-harvest/0.1 (+aggregator; OAI-PMH and Sierra harvester)"


@dataclass(frozen=True)
class HttpPolicy:
    """How patient to be with one partner; sane defaults for a nightly job."""

    connect_timeout: float = 10.0
    read_timeout: float = 120.0
    retries: int = 5
    backoff_factor: float = 2.0
    backoff_max: float = 120.0
    retry_after_cap: float = 300.0
    user_agent: str = USER_AGENT
    retry_statuses: frozenset[int] = RETRY_STATUSES


class CappedRetry(Retry):
    """urllib3 Retry that caps Retry-After and names the partner in its log lines."""

    def __init__(self, *args: Any, retry_after_cap: float = 300.0, label: str = "", **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.retry_after_cap = retry_after_cap
        self.label = label

    def new(self, **kw: Any) -> "CappedRetry":
        kw.setdefault("retry_after_cap", self.retry_after_cap)
        kw.setdefault("label", self.label)
        return super().new(**kw)  # type: ignore[return-value]

    def parse_retry_after(self, retry_after: str) -> float:
        return min(super().parse_retry_after(retry_after), self.retry_after_cap)

    def increment(self, method=None, url=None, response=None, error=None, _pool=None, _stacktrace=None):  # type: ignore[override]
        new = super().increment(method, url, response, error, _pool, _stacktrace)
        cause = f"HTTP {response.status}" if response is not None else f"{type(error).__name__}: {error}"
        wait = new.get_retry_after(response) if response is not None else None
        if wait is None:
            wait = new.get_backoff_time()
        log.warning(
            "%s: %s %s failed (%s); retry %d of %d in %.1fs",
            self.label or "partner", method, url, cause,
            len(new.history), self.total if isinstance(self.total, int) else -1, wait,
        )
        return new


class PartnerSession(requests.Session):
    """A Session whose requests always carry a timeout (requests has none by default)."""

    def __init__(self, timeout: tuple[float, float]):
        super().__init__()
        self.default_timeout = timeout

    def request(self, method: str, url: str, **kwargs: Any) -> requests.Response:  # type: ignore[override]
        kwargs.setdefault("timeout", self.default_timeout)
        return super().request(method, url, **kwargs)


def build_session(label: str, policy: HttpPolicy | None = None) -> PartnerSession:
    """A session for one partner's harvest: gzip accepted, retries with backoff."""
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
        label=label,
    )
    session = PartnerSession((policy.connect_timeout, policy.read_timeout))
    adapter = HTTPAdapter(max_retries=retry, pool_connections=1, pool_maxsize=2)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    session.headers.update({"User-Agent": policy.user_agent, "Accept-Encoding": "gzip, deflate"})
    return session
