"""HTTP for an IIIF Change Discovery stream: the collection, its pages, the descriptions.

Retries, Retry-After, timeouts and caps are the transport's (transport.py). Stream pages
are read one at a time, ``page_delay`` apart; descriptions are read by a bounded pool of
threads, each with its own session (a requests Session is not shared between threads).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import requests

from partner_harvest.errors import PartnerCapExceeded, PartnerDataError, PartnerHttpError
from partner_harvest.iiif.stream import Collection, Page, StreamError, parse_collection, parse_page
from partner_harvest.transport import partner_request

log = logging.getLogger(__name__)

STREAM_ACCEPT = 'application/ld+json;profile="http://iiif.io/api/discovery/1/context.json", application/json;q=0.9'
DESCRIPTION_ACCEPT = {
    "linked_art": 'application/ld+json;profile="https://linked.art/ns/v1/linked-art.json", '
                  "application/ld+json;q=0.9, application/json;q=0.8",
}
XML_ACCEPT = "application/xml, text/xml;q=0.9"


@dataclass(frozen=True)
class Fetched:
    """A description's answer: the body, or the HTTP status and cause of its failure."""

    url: str
    status: int | None  # None: no HTTP answer (the transport gave up)
    body: bytes = b""
    cause: str = ""

    @property
    def ok(self) -> bool:
        return self.status == 200


class IiifClient:
    def __init__(self, partner_id: str, collection_url: str, session: requests.Session, *,
                 session_factory: Callable[[], requests.Session] | None = None, page_delay: float = 0.0,
                 max_pages: int = 100_000, sleep: Callable[[float], None] = time.sleep):
        self.partner_id = partner_id
        self.collection_url = collection_url
        self.session = session
        self.session_factory = session_factory
        self.page_delay = page_delay
        self.max_pages = max_pages
        self.sleep = sleep
        self.pages_read = 0
        self._last_page_at: float | None = None
        self._local = threading.local()

    # -- the stream --------------------------------------------------------------------

    def collection(self) -> Collection:
        body = self._json(self.collection_url, "collection")
        try:
            return parse_collection(body, self.collection_url)
        except StreamError as exc:
            raise PartnerDataError(self.partner_id, f"GET {self.collection_url}", str(exc)) from None

    def page(self, url: str) -> Page:
        self.pages_read += 1
        if self.pages_read > self.max_pages:
            raise PartnerCapExceeded(self.partner_id, f"GET {url}", f"the walk passed {self.max_pages} stream "
                                     "pages in one run (options.iiif.max_pages)")
        if self.page_delay and self._last_page_at is not None:
            wait = self.page_delay - (time.monotonic() - self._last_page_at)
            if wait > 0:
                self.sleep(wait)
        try:
            body = self._json(url, "page")
        finally:
            self._last_page_at = time.monotonic()
        try:
            return parse_page(body, url)
        except StreamError as exc:
            raise PartnerDataError(self.partner_id, f"GET {url}", str(exc)) from None

    def _json(self, url: str, what: str) -> Any:
        response = self._get(self.session, url, STREAM_ACCEPT)
        request = f"GET {url}"
        if response.status_code != 200:
            snippet = " ".join(response.text[:200].split())
            raise PartnerHttpError(self.partner_id, request,
                                   f"the stream's {what}: HTTP {response.status_code} {response.reason}: {snippet}")
        try:
            return json.loads(response.content)
        except (ValueError, RecursionError) as exc:
            raise PartnerDataError(self.partner_id, request, f"the stream's {what} is not JSON: "
                                   f"{type(exc).__name__}: {str(exc)[:120]}") from None

    def _get(self, session: requests.Session, url: str, accept: str) -> requests.Response:
        request = f"GET {url}"
        with partner_request(self.partner_id, request):
            return session.get(url, headers={"Accept": accept})

    # -- descriptions ------------------------------------------------------------------

    def description(self, url: str, prefix: str) -> Fetched:
        """One description; a 4xx is the object's answer (quarantined by the caller). A 429
        or 5xx left after the transport's retries, like a transport failure, is the partner's
        outage: it raises, so the run fails and is retried, and the object is asked again
        (quarantined, nothing would ask for it until its next activity)."""
        session = self._thread_session()
        response = self._get(session, url, DESCRIPTION_ACCEPT.get(prefix, XML_ACCEPT))
        if response.status_code != 200:
            snippet = " ".join(response.text[:200].split())
            cause = f"HTTP {response.status_code} {response.reason}: {snippet}"
            if response.status_code == 429 or response.status_code >= 500:
                raise PartnerHttpError(self.partner_id, f"GET {url}", cause)
            return Fetched(url, response.status_code, cause=cause)
        return Fetched(url, 200, response.content)

    def _thread_session(self) -> requests.Session:
        if self.session_factory is None:
            return self.session
        session = getattr(self._local, "session", None)
        if session is None:
            session = self._local.session = self.session_factory()
        return session
