"""Sierra ILS REST API (v6) requests: OAuth2 client credentials, errors, keyset pages, export.

Facts of production catalogues this encodes (see the Sierra reference):
- tokens last an hour and cannot be refreshed: fetch a new one before expiry, and once
  more on any 401 (codes 123/120 documented, 113 seen on expired tokens);
- 404 with code 107 on a list query means "no results";
- pages end on a short page; ``total`` is only the size of this page;
- ``bibs/marc`` is two-phase: a summary naming a file, the file, then DELETE the file.
  The file is fetched and deleted on the configured base URL by its id: the summary's
  URL may name another host, which must never see our token.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import urlencode, urlsplit

import requests
from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_exponential

from partner_harvest.errors import (
    ConfigurationError,
    HarvestLoopError,
    PartnerDataError,
    PartnerHttpError,
    PartnerProtocolError,
)
from partner_harvest.sierra.spec import CLIENT_STATUSES
from partner_harvest.transport import RETRY_STATUSES, ServerAsksToWait, partner_request

log = logging.getLogger(__name__)

NOT_FOUND = 107
EXPORT_FAILED = 135  # "External Process Failed : bib2Marc process failed twice..."
RATE_LIMITED = 138
MAX_LIMIT = 2000
# One retry layer per failure kind: the transport hands the statuses this client reads over
# at once (spec.CLIENT_STATUSES) and this client retries the 500s (``server_error_tries``).
# The gateway answers (502, 503, 504) and broken connections are the transport's alone
# (``options.http.retries``).
TRANSPORT_RETRY_STATUSES = RETRY_STATUSES - CLIENT_STATUSES
_FILE_ID = re.compile(r"[A-Za-z0-9._-]+")


class SierraServerError(PartnerHttpError):
    """A 5xx that may pass; retried a few times before it fails the task.

    ``code`` is Sierra's error code from the body (135 "External Process Failed" for an
    export the server cannot build), None when the body carries none. ``status`` is the
    HTTP status: one the transport already retried is not retried again here.
    """

    def __init__(self, partner_id: str, request: str, cause: str, code: int | None = None,
                 status: int = 500):
        super().__init__(partner_id, request, cause)
        self.code = code
        self.status = status


class RateLimited(PartnerProtocolError):
    """Code 138 "Rate exceeded for endpoint" or HTTP 429: wait, then resume.

    ``retry_after`` is the wait the server named in seconds (a ``Retry-After`` header,
    or "Try again in N minutes" in the 138 description), None when it named none.
    """

    def __init__(self, partner_id: str, request: str, cause: str, retry_after: float | None = None):
        super().__init__(partner_id, request, cause)
        self.retry_after = retry_after


_TRY_AGAIN = re.compile(r"try again in (\d+) (second|minute|hour)s?", re.IGNORECASE)
_UNIT_SECONDS = {"second": 1, "minute": 60, "hour": 3600}


def retry_after_seconds(response: requests.Response, now: datetime | None = None) -> float | None:
    """The wait a rate-limited response names: ``Retry-After`` (seconds or HTTP date), or the 138 text."""
    header = (response.headers.get("Retry-After") or "").strip()
    if header.isdigit():
        return float(header)
    if header:
        try:
            when = parsedate_to_datetime(header)
        except (TypeError, ValueError):
            when = None
        if when is not None:
            return max(0.0, (when - (now or datetime.now(timezone.utc))).total_seconds())
    match = _TRY_AGAIN.search(response.text[:1000])
    if match:
        return float(int(match.group(1)) * _UNIT_SECONDS[match.group(2).lower()])
    return None


@dataclass(frozen=True)
class ExportBlock:
    """One ``bibs/marc`` export: the summary and the ISO 2709 bytes of its file."""

    summary: dict[str, Any]
    marc: bytes

    @property
    def errors(self) -> int:
        return int(self.summary.get("errors") or 0)

    @property
    def input_records(self) -> int | None:
        """How many ids the block covered, deleted (and omitted) ones included; None if unsaid."""
        return _count(self.summary.get("inputRecords"))

    @property
    def output_records(self) -> int:
        return _count(self.summary.get("outputRecords")) or 0

    @property
    def deleted_records(self) -> int | None:
        return _count(self.summary.get("deletedRecords"))


def _count(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value >= 0 else None
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return None


def _id_range(start: int, end: int | None) -> str:
    return f"[{start},{'' if end is None else end}]"


def error_code(response: requests.Response) -> int | None:
    try:
        body = response.json()
    except ValueError:
        return None
    code = body.get("code") if isinstance(body, dict) else None
    return int(code) if isinstance(code, int) or (isinstance(code, str) and code.isdigit()) else None


def _body_snippet(response: requests.Response) -> str:
    return " ".join(response.text[:400].split())


class SierraClient:
    """Talks to one Sierra API base URL (``.../iii/sierra-api/v6``) with a client key."""

    def __init__(
        self,
        partner_id: str,
        base_url: str,
        session: requests.Session,
        client_key: str,
        client_secret: str,
        *,
        refresh_margin: float = 60.0,
        server_error_tries: int = 3,
        server_error_backoff: float = 2.0,
        transport_retries: frozenset[int] = TRANSPORT_RETRY_STATUSES,
        monotonic: Callable[[], float] = time.monotonic,
    ):
        """``transport_retries``: the statuses the session's own retries already cover
        (its policy's ``retry_statuses``); a server error with one of them is not retried again."""
        if not client_key or not client_secret:
            raise ConfigurationError(partner_id, base_url, "the Connection needs the client key as login and the secret as password")
        self.partner_id = partner_id
        self.base_url = base_url.rstrip("/")
        self.session = session
        self._key = client_key
        self._secret = client_secret
        self._token: str | None = None
        self._expires_at = 0.0
        self.refresh_margin = refresh_margin
        self.server_error_tries = server_error_tries
        self.server_error_backoff = server_error_backoff
        self.transport_retries = frozenset(transport_retries)
        self.monotonic = monotonic
        self.tokens_fetched = 0

    def __repr__(self) -> str:  # never show the secret or the token
        return f"SierraClient({self.partner_id!r}, {self.base_url!r})"

    # -- auth ------------------------------------------------------------------------

    def _fetch_token(self) -> str:
        url = f"{self.base_url}/token"
        with partner_request(self.partner_id, f"POST {url}", self._rate_limited(f"POST {url}")):
            response = self.session.post(url, auth=(self._key, self._secret), data={"grant_type": "client_credentials"})
        if response.status_code in (400, 401, 403):
            raise ConfigurationError(
                self.partner_id, f"POST {url}",
                f"the API refused the client credentials (HTTP {response.status_code}, code {error_code(response)}); "
                "check the Connection's login (client key) and password (client secret)",
            )
        if response.status_code >= 400:
            raise PartnerHttpError(self.partner_id, f"POST {url}", f"HTTP {response.status_code}: {_body_snippet(response)}")
        try:
            body = response.json()
            token, lifetime = body["access_token"], float(body.get("expires_in", 3600))
        except (ValueError, KeyError, TypeError) as exc:
            raise PartnerDataError(self.partner_id, f"POST {url}", "token response without access_token") from exc
        self._token = token
        self._expires_at = self.monotonic() + lifetime - self.refresh_margin
        self.tokens_fetched += 1
        log.info("%s: obtained an access token valid for %.0f s", self.partner_id, lifetime)
        return token

    def _bearer(self) -> str:
        if self._token is None or self.monotonic() >= self._expires_at:
            return self._fetch_token()
        return self._token

    # -- requests --------------------------------------------------------------------

    def describe(self, method: str, path: str, params: dict[str, Any] | None = None) -> str:
        query = f"?{urlencode(params)}" if params else ""
        return f"{method} {self.base_url}{path}{query}"

    def _send(self, method: str, url: str, params: dict[str, Any] | None, accept: str | None) -> requests.Response:
        headers = {"Authorization": f"Bearer {self._bearer()}"}
        if accept:
            headers["Accept"] = accept
        return self.session.request(method, url, params=params, headers=headers)

    def request(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, Any] | None = None,
        accept: str | None = None,
        empty_ok: bool = False,
        tries: int | None = None,
    ) -> requests.Response | None:
        """One authenticated call on the base URL; None for "no results" (404/107) when ``empty_ok``.

        ``tries`` overrides ``server_error_tries`` (the export's bisection asks once per sub-block).
        """
        if not path.startswith("/"):
            raise ValueError(f"{self.partner_id}: requests go to paths under the base URL, not {path!r}")
        url = f"{self.base_url}{path}"
        what = self.describe(method, url.removeprefix(self.base_url), params)
        retrying = Retrying(
            stop=stop_after_attempt(max(1, self.server_error_tries if tries is None else tries)),
            wait=wait_exponential(multiplier=self.server_error_backoff, max=60),
            retry=retry_if_exception(self._ours_to_retry),
            reraise=True,
        )
        for attempt in retrying:
            with attempt:
                return self._request_once(method, url, what, params, accept, empty_ok)
        raise AssertionError("unreachable")

    def _rate_limited(self, what: str) -> Callable[[ServerAsksToWait], RateLimited]:
        """A long Retry-After is Sierra's rate limit: the harvester frees the worker slot for the wait."""
        return lambda exc: RateLimited(self.partner_id, what, str(exc), exc.seconds)

    def _ours_to_retry(self, exc: BaseException) -> bool:
        """A server error the transport did not already retry (one layer per failure kind).
        Not 135: bib2Marc already "failed twice" on the server, and the export's bisection is
        its retry (a block that fails for no bib of its own passes at half the size)."""
        return (isinstance(exc, SierraServerError) and exc.status not in self.transport_retries
                and exc.code != EXPORT_FAILED)

    def _request_once(
        self, method: str, url: str, what: str, params: dict[str, Any] | None, accept: str | None, empty_ok: bool
    ) -> requests.Response | None:
        pacer = getattr(self.session, "pacer", None)  # a 500's body may say it was one bib's failure
        with pacer.judged_by_caller() if pacer is not None else nullcontext():
            return self._answer(method, url, what, params, accept, empty_ok, pacer)

    def _answer(
        self, method: str, url: str, what: str, params: dict[str, Any] | None, accept: str | None, empty_ok: bool,
        pacer: Any,
    ) -> requests.Response | None:
        with partner_request(self.partner_id, what, self._rate_limited(what)):
            response = self._send(method, url, params, accept)
            # 120/123 are the documented "token expired" codes; recorded servers also answer an
            # expired token with 113 "Invalid or missing authorization header": any 401 gets
            # one fresh token, and a second 401 fails the task (below).
            if response.status_code == 401:
                log.info("%s: access token rejected (code %s); fetching a new one", self.partner_id, error_code(response))
                self._token = None
                response = self._send(method, url, params, accept)
        code = error_code(response) if response.status_code >= 400 else None
        if response.status_code == 401:
            raise ConfigurationError(self.partner_id, what, f"unauthorized after a fresh token (code {code}): {_body_snippet(response)}")
        if response.status_code == 404 and code == NOT_FOUND and empty_ok:
            return None
        if code == RATE_LIMITED or response.status_code == 429:
            why = "code 138" if code == RATE_LIMITED else "HTTP 429"
            raise RateLimited(self.partner_id, what, f"rate limited ({why}): {_body_snippet(response)}",
                              retry_after_seconds(response))
        if response.status_code >= 500:
            if code == EXPORT_FAILED and pacer is not None:  # a bib bib2Marc cannot convert: no strain on the host
                pacer.excuse()
            log.warning("%s: %s answered HTTP %d: %s", self.partner_id, what, response.status_code, _body_snippet(response))
            raise SierraServerError(self.partner_id, what, f"HTTP {response.status_code}: {_body_snippet(response)}",
                                    code, response.status_code)
        if response.status_code >= 400:
            raise PartnerProtocolError(self.partner_id, what, f"HTTP {response.status_code} (code {code}): {_body_snippet(response)}")
        return response

    def get_json(self, path: str, params: dict[str, Any] | None = None, *, empty_ok: bool = False,
                 tries: int | None = None) -> dict[str, Any] | None:
        response = self.request("GET", path, params=params, empty_ok=empty_ok, tries=tries)
        if response is None:
            return None
        try:
            body = response.json()
        except ValueError as exc:
            raise PartnerDataError(self.partner_id, self.describe("GET", path, params),
                                   f"expected JSON, got {response.headers.get('Content-Type')}: {_body_snippet(response)}") from exc
        if not isinstance(body, dict):
            raise PartnerDataError(self.partner_id, self.describe("GET", path, params), "expected a JSON object")
        return body

    # -- what the harvester uses -----------------------------------------------------

    def server_time(self) -> datetime:
        """The server's clock from its ``Date`` header: the window's frozen until."""
        response = self.request("GET", "/info/token")
        assert response is not None
        header = response.headers.get("Date")
        if not header:
            raise PartnerDataError(self.partner_id, self.describe("GET", "/info/token"), "no Date header to freeze the window on")
        return parsedate_to_datetime(header).astimezone(timezone.utc)

    def bib_pages(self, params: dict[str, Any], limit: int, start_id: int = 0,
                  end_id: int | None = None) -> Iterator[list[dict[str, Any]]]:
        """Keyset pages of ``GET bibs`` (:meth:`pages`)."""
        return self.pages("/bibs", params, limit, start_id, end_id)

    def pages(self, path: str, params: dict[str, Any], limit: int, start_id: int = 0,
              end_id: int | None = None) -> Iterator[list[dict[str, Any]]]:
        """Keyset pages of a record list (``GET bibs``, ``items``, ``holdings``): ``id=[cursor,]``
        (``[cursor,end_id]`` for an id slice), next cursor ``int(last id) + 1``.

        Ends on a short page (never on ``total``) or 404/107. Deleted-records polls answer
        an empty day with 200 and no entries; both are zero results.
        """
        limit = min(limit, MAX_LIMIT)
        cursor = start_id
        while True:
            if end_id is not None and cursor > end_id:
                return
            query = {**params, "id": _id_range(cursor, end_id), "limit": limit}
            body = self.get_json(path, query, empty_ok=True)
            entries = (body or {}).get("entries") or []
            yield entries
            if len(entries) < limit:
                return
            try:
                next_cursor = int(str(entries[-1]["id"]).strip()) + 1
            except (KeyError, TypeError, ValueError):
                raise PartnerDataError(self.partner_id, self.describe("GET", path, query),
                                       f"a full page whose last entry has no numeric id to page on: "
                                       f"{str(entries[-1])[:200]}") from None
            if next_cursor <= cursor:
                raise HarvestLoopError(self.partner_id, self.describe("GET", path, query),
                                       f"ids did not ascend (last id {entries[-1]['id']} after cursor {cursor})")
            cursor = next_cursor

    def export_block(self, start_id: int, limit: int, params: dict[str, Any] | None = None,
                     end_id: int | None = None, tries: int | None = None) -> ExportBlock | None:
        """Phase 1-3 of ``bibs/marc`` for the lowest ``limit`` ids from ``start_id`` (up to
        ``end_id`` for an id slice); None on 404/107.

        ``limit`` above Sierra's cap is sent as the cap (the caller pages on, whatever it asked).
        """
        query = {**(params or {}), "id": _id_range(start_id, end_id), "limit": min(max(1, limit), MAX_LIMIT)}
        summary = self.get_json("/bibs/marc", query, empty_ok=True, tries=tries)
        if summary is None:
            return None
        file_ref = summary.get("file")
        if not file_ref:
            if _count(summary.get("outputRecords")):
                raise PartnerDataError(self.partner_id, self.describe("GET", "/bibs/marc", query),
                                       f"export summary without a file: {summary}")
            return ExportBlock(summary, b"")
        file_path = self.export_file_path(str(file_ref))
        try:
            if not _count(summary.get("outputRecords")):
                return ExportBlock(summary, b"")
            response = self.request("GET", file_path)
            assert response is not None
            content_type = response.headers.get("Content-Type", "")
            if "json" in content_type or "html" in content_type:
                raise PartnerDataError(self.partner_id, self.describe("GET", file_path),
                                       f"export file is {content_type}, not MARC: {_body_snippet(response)}")
            return ExportBlock(summary, response.content)
        finally:
            self._delete_file(file_path)

    def export_file_path(self, file_ref: str) -> str:
        """The export file's path on OUR base URL, from the id at the end of the summary's ``file``.

        The summary's URL is server-supplied: sending our bearer token (or a DELETE) to
        whatever host it names would hand the token to that host. Only its last path
        segment is used; another origin is logged.
        """
        parts = urlsplit(file_ref)
        file_id = parts.path.rstrip("/").rsplit("/", 1)[-1]
        if not _FILE_ID.fullmatch(file_id) or file_id in (".", ".."):
            raise PartnerDataError(self.partner_id, "GET bibs/marc", f"export summary names no usable file id: {file_ref[:200]!r}")
        ours = urlsplit(self.base_url)
        if parts.netloc and (parts.scheme.lower(), parts.netloc.lower()) != (ours.scheme.lower(), ours.netloc.lower()):
            log.warning("%s: the export summary names its file on another origin (%s://%s); fetching and "
                        "deleting file %s on the configured base %s instead, no request goes there",
                        self.partner_id, parts.scheme, parts.netloc, file_id, self.base_url)
        return f"/bibs/marc/files/{file_id}"

    def _delete_file(self, file_path: str) -> None:
        """Exports leave files on the server until deleted; never leave one behind."""
        try:
            self.request("DELETE", file_path)
        except (PartnerHttpError, PartnerProtocolError) as exc:
            log.warning("%s: could not delete export file %s: %s", self.partner_id, file_path, exc.cause)

    def bib_marc_json(self, bib_id: str) -> dict[str, Any]:
        """A whole bib as MARC-in-JSON through ``bibs/{id}/marc`` (no export size ceiling)."""
        response = self.request("GET", f"/bibs/{bib_id}/marc", accept="application/marc-in-json")
        assert response is not None
        try:
            return json.loads(response.content)
        except ValueError as exc:
            raise PartnerDataError(self.partner_id, self.describe("GET", f"/bibs/{bib_id}/marc"),
                                   f"expected MARC-in-JSON: {_body_snippet(response)}") from exc
