"""OAI-PMH requests over one session: Identify, ListMetadataFormats and list streams.

The list stream follows resumptionTokens to exhaustion. The first request carries the
selective-harvest arguments; every continuation carries ``verb`` and
``resumptionToken`` only (I7). A token seen twice, or a run of pages that carry a token
but no records, is a loop, not progress.

Pipelining: a chain is inherently sequential (the next request needs this page's
token), but the token can be read off the page's raw bytes before the page is parsed
(``parse.guess_token``). So one fetcher thread per chain fetches page N+1 while the
caller parses, validates and stages page N, and the request for N+1 goes out the moment
page N's bytes arrive. It never runs further ahead than that: at most two pages are held
at once (I5), one request is in flight. A guess the parsed token contradicts costs one
discarded request, never a wrong page. The thread ends with the stream, however the
stream ends.
"""

from __future__ import annotations

import logging
import re
import sys
import threading
from collections.abc import Callable, Generator, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from urllib.parse import urlencode

import requests

from partner_harvest.errors import (
    HarvestLoopError,
    PartnerCapExceeded,
    PartnerDataError,
    PartnerHttpError,
    PartnerProtocolError,
)
from partner_harvest.formats.checks import DEFAULT_POLICY, Policy
from partner_harvest.oai import parse
from partner_harvest.oai.chain_caps import ChainCaps, short_params, token_digest
from partner_harvest.oai.errors import BadArgument, BadResumptionToken, OaiProtocolError, OaiResponseError
from partner_harvest.transport import partner_request
from partner_harvest.xmlsafe import XmlInputError, XmlLimits, xml_limits

log = logging.getLogger(__name__)

# While a chain is pipelined the fetcher thread needs the GIL back after every socket read,
# and the caller's validation holds it for the interpreter's switch interval (5 ms by
# default) each time: a page read in many chunks waited tens of ms for its turns. A short
# interval while chains run lets the fetcher in promptly (measured: the 200 ms chain went
# from 0.85x to 0.91x of the bare fetch loop); the previous interval comes back after.
PIPELINE_SWITCH_INTERVAL = 0.0005
_switch_lock = threading.Lock()
_switch_users = 0
_switch_saved = 0.0


@contextmanager
def _prompt_thread_switches() -> Iterator[None]:
    global _switch_users, _switch_saved
    with _switch_lock:
        if _switch_users == 0:
            _switch_saved = sys.getswitchinterval()
            sys.setswitchinterval(min(_switch_saved, PIPELINE_SWITCH_INTERVAL))
        _switch_users += 1
    try:
        yield
    finally:
        with _switch_lock:
            _switch_users -= 1
            if _switch_users == 0:
                sys.setswitchinterval(_switch_saved)


# Statuses a repository uses to refuse a list request's window as too large (413: users
# of other harvesters report "please restrict the request period" from a national library;
# 422: a research repository on monthly windows). Only a body that is not an OAI-PMH error
# counts: an OAI error under such a status is the error it carries.
WINDOW_REFUSAL_STATUSES = frozenset({413, 422})
# An OAI badArgument that words the window as the problem; a badArgument about anything else
# (a malformed date, an unknown argument) stays a protocol error.
_TOO_LARGE = re.compile(r"too (large|big|long|many)|restrict|narrow|smaller|shorter|maximum|at most|exceed",
                        re.IGNORECASE)


class WindowTooLarge(PartnerHttpError):
    """The repository refused a list request's window as too large: ask for smaller ones."""


class Forbidden(PartnerHttpError):
    """HTTP 403: the repository refuses this request (one record restricted, or the route gone)."""


def _carries_window(params: dict[str, str]) -> bool:
    return params.get("verb") in ("ListRecords", "ListIdentifiers") and "resumptionToken" not in params


class OaiClient:
    """Talks OAI-PMH to one partner endpoint; turns failures into named errors."""

    def __init__(
        self,
        partner_id: str,
        base_url: str,
        session: requests.Session,
        *,
        max_empty_pages: int = 3,
        xml_limits: XmlLimits | None = None,
        validation: Policy = DEFAULT_POLICY,
        caps: ChainCaps | None = None,
    ):
        self.partner_id = partner_id
        self.base_url = base_url
        self.session = session
        self.max_empty_pages = max_empty_pages
        self.xml_limits = xml_limits or XmlLimits()
        self.validation = validation  # the partner's checks (registry options.validation): pages are parsed here
        self.caps = caps or ChainCaps()  # a token's size, a chain's pages

    # -- single requests ---------------------------------------------------------------

    def describe(self, params: dict[str, str]) -> str:
        return f"GET {self.base_url}?{urlencode(params)}"

    def fetch(self, params: dict[str, str]) -> bytes:
        """One OAI-PMH request; HTTP-level failures (after retries) become PartnerHttpError.

        A 503 whose Retry-After is longer than a task may sleep becomes PartnerAsksToWait:
        the task is rescheduled and frees its worker slot. Its window (or slice) then starts
        again from its frozen bounds: a resumptionToken does not outlive such a wait.
        """
        request = self.describe(params)
        with partner_request(self.partner_id, request):
            response = self.session.get(self.base_url, params=params)
        if response.status_code >= 400:
            codes = parse.error_codes(response.content)
            if codes:  # the repository speaking under the wrong status: read the OAI error
                log.info("%s: HTTP %d carries OAI-PMH error %s; read as that error (%s)",
                         self.partner_id, response.status_code, ", ".join(codes), request)
                return response.content
            snippet = " ".join(response.text[:300].split())
            cause = f"HTTP {response.status_code} {response.reason}: {snippet}"
            if response.status_code in WINDOW_REFUSAL_STATUSES and _carries_window(params):
                raise WindowTooLarge(self.partner_id, request, cause)
            if response.status_code == 403:
                raise Forbidden(self.partner_id, request, cause)
            raise PartnerHttpError(self.partner_id, request, cause)
        return response.content

    def call(self, params: dict[str, str], parser: Callable[[bytes], object]) -> object:
        """Fetch and parse, naming partner, request and cause on any failure (I9)."""
        content = self.fetch(params)
        with self._named_errors(params):
            return parser(content)

    @contextmanager
    def _named_errors(self, params: dict[str, str]) -> Iterator[None]:
        """Parsing failures as PartnerProtocolError / PartnerDataError naming the request."""
        try:
            with xml_limits(self.xml_limits):
                yield
        except BadResumptionToken:
            raise
        except BadArgument as exc:
            if _carries_window(params) and _TOO_LARGE.search(exc.message):
                raise WindowTooLarge(self.partner_id, self.describe(params), f"OAI-PMH error {exc}") from exc
            raise PartnerProtocolError(self.partner_id, self.describe(params), f"OAI-PMH error {exc}") from exc
        except OaiProtocolError as exc:
            raise PartnerProtocolError(self.partner_id, self.describe(params), f"OAI-PMH error {exc}") from exc
        except (XmlInputError, OaiResponseError) as exc:
            raise PartnerDataError(self.partner_id, self.describe(params), f"unusable response: {exc}") from exc

    def identify(self) -> parse.Identify:
        return self.call({"verb": "Identify"}, parse.parse_identify)  # type: ignore[return-value]

    def metadata_prefixes(self) -> list[str]:
        formats = self.call({"verb": "ListMetadataFormats"}, parse.parse_metadata_formats)
        return [f.prefix for f in formats]  # type: ignore[attr-defined]

    def resolve_prefix(self, configured: str) -> str:
        """``auto`` means LIDO where advertised, else the mandatory oai_dc."""
        if configured != "auto":
            return configured
        prefixes = self.metadata_prefixes()
        return "lido" if "lido" in prefixes else "oai_dc"

    # -- list streams ------------------------------------------------------------------

    def list_pages(
        self,
        verb: str,
        *,
        metadata_prefix: str,
        set_spec: str | None,
        from_: str | None,
        until: str | None,
        ahead: bool = True,
    ) -> Generator[parse.ListPage, None, None]:
        """Yield each page of a ListRecords/ListIdentifiers chain until the token runs out.

        Raises BadResumptionToken unchanged: the caller restarts the window. Pipelined,
        the next page is already being fetched while the caller holds this one; close
        the generator (``contextlib.closing``) when leaving early, so the fetcher thread
        is stopped then and not when the generator is collected. ``ahead`` False: the next
        page is asked for only once the caller is done with this one (a caller that sends
        requests of its own per page stays within the partner's concurrency).
        """
        params: dict[str, str] = {"verb": verb, "metadataPrefix": metadata_prefix}
        if set_spec:
            params["set"] = set_spec
        if from_:
            params["from"] = from_
        if until:
            params["until"] = until
        prefix = metadata_prefix if verb == "ListRecords" else None
        with _prompt_thread_switches():
            yield from self._pipelined_pages(verb, prefix, params, ahead)

    def _pipelined_pages(self, verb: str, prefix: str | None, params: dict[str, str],
                         ahead: bool = True) -> Iterator[parse.ListPage]:
        """One worker, and a request submitted only once the page before it arrived: at
        most one page ahead. The next request leaves on the guessed token, before this page
        is parsed; a guess the parse contradicts (or a loop) is awaited and dropped, then
        the right request is sent. Shutting down waits for a request in flight."""
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"oai-fetch-{self.partner_id}")
        pending: Future[bytes] | None = None
        try:
            pending = pool.submit(self.fetch, params)
            chain = _Chain(self)
            while True:
                assert pending is not None  # every path that comes round again sent the next request
                content = pending.result()  # a fetch error surfaces here with its own type
                pending = None
                asked = params
                guess = parse.guess_token(content) if ahead else None
                if guess is not None and self.caps.token_problem(guess) is None:
                    params = _continuation(asked, guess)
                    pending = pool.submit(self.fetch, params)
                with self._named_errors(asked):
                    page = parse.parse_list_page(content, verb, prefix, self.validation)
                del content
                token = page.token
                loop = chain.check(asked, token, page)
                if token != guess or loop is not None:
                    if pending is not None:
                        log.debug("%s: dropping the request sent on the guessed token %r (parsed: %r)",
                                  self.partner_id, guess, token)
                        _drop(pending)
                        pending = None
                    if token and loop is None:
                        params = _continuation(asked, token)
                        if ahead:
                            pending = pool.submit(self.fetch, params)
                yield page
                if loop is not None:
                    raise loop
                if not token:
                    return
                if pending is None:  # not ahead: the next page once the caller is done with this one
                    pending = pool.submit(self.fetch, params)
        finally:
            if pending is not None:
                pending.cancel()
            pool.shutdown(wait=True, cancel_futures=True)


def _drop(request: Future[bytes]) -> None:
    """Let a request that is no longer wanted end (one request in flight per chain), and
    ignore what it returned or raised."""
    if not request.cancel():
        wait([request])


def _continuation(params: dict[str, str], token: str) -> dict[str, str]:
    """The next request of a chain: verb and resumptionToken only (I7)."""
    return {"verb": params["verb"], "resumptionToken": token}


class _Chain:
    """Loop detection over one token chain: a token seen twice, or too many empty pages;
    and its caps (oai/chain_caps.py): a token too long, more pages than the list justifies."""

    def __init__(self, client: OaiClient):
        self.client = client
        self.seen_tokens: set[bytes] = set()  # digests: the tokens themselves are not kept
        self.empty_run = 0
        self.pages = 0
        self.page_size: int | None = None  # items of the chain's first page with items
        self.list_size: int | None = None  # the largest completeListSize announced

    def check(self, params: dict[str, str], token: str | None,
              page: parse.ListPage) -> HarvestLoopError | PartnerCapExceeded | None:
        """The loop error the page answering `params` reveals, else None (token recorded)."""
        self.pages += 1
        has_items = bool(page.items)
        if has_items and self.page_size is None:
            self.page_size = len(page.items)
        if page.complete_list_size is not None:
            self.list_size = max(self.list_size or 0, page.complete_list_size)
        if not token:
            return None
        client = self.client
        capped = client.caps.token_problem(token) or client.caps.pages_problem(
            self.pages, self.list_size, self.page_size, client.max_empty_pages)
        if capped is not None:
            return PartnerCapExceeded(client.partner_id, client.describe(short_params(params)),
                                      f"{capped}; stopping the chain")
        digest = token_digest(token)
        if digest in self.seen_tokens:  # a loop guard: fails instead of hanging
            return HarvestLoopError(
                client.partner_id, client.describe(params),
                f"the repository handed out resumptionToken {token!r} a second time; "
                "stopping instead of looping forever",
            )
        self.seen_tokens.add(digest)
        self.empty_run = self.empty_run + 1 if not has_items else 0
        if self.empty_run > client.max_empty_pages:
            return HarvestLoopError(
                client.partner_id, client.describe(params),
                f"{self.empty_run} pages in a row carried a resumptionToken but no records",
            )
        return None
