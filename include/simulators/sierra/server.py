"""A loopback Sierra ILS REST API (v6, bib reads) over a SimulatedCatalogue.

Reproduces the production behaviours of docs/design/sierra.md and sierra-real-world.md so a
harvester's tests meet them before a real catalogue does: 404/107 for empty
ranges (but 200 for an empty deletion poll), ``total`` = page size, the 2000
cap, date-only deletedDate, the ``fields=,`` 500, the two-phase MARC export
with its 99,999-byte truncation and rate limit, token expiry on the simulated
clock, and transport faults on demand (every switch a field of `SierraFaults`,
``faults.py``). The ``Date`` header follows the simulated clock, because clients freeze
their change window on it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import math
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from email.utils import formatdate
from typing import Any, Protocol, cast
from urllib.parse import SplitResult, parse_qsl

from .. import loopback
from ..control import CONTROL_PREFIX, ControlledServer
from ..faults import Shot
from ..loopback import LoopbackHandler, query_log_form, status_phrase
from . import marc
from .catalogue import Bib, BibQuery, SimulatedCatalogue, day_text, iso_z
from .faults import FAULT_ACTIONS, ExportFailure, Failure, RateLimitOnce, SierraFaults

API_PATH = "/iii/sierra-api/v6"
_API_PATHS = (API_PATH, "/iii/sierra-api/v5")  # v5 clients use the same shapes
JSON_TYPE = "application/json;charset=UTF-8"
MAX_LIMIT = 2000
DEFAULT_LIMIT = 50
HOUR = 3600
# Production's text, byte for byte (tests/fixtures/realworld/sierra/brown/bibs-marc-500-135.json).
EXPORT_FAILED_135 = (
    "External Process Failed : bib2Marc process failed twice. Error1: External Process Failed : bib2Marc "
    "process failed : External Process Failed : bib2Marc process failed. No records exported, check parameters "
    "Error2: External Process Failed : bib2Marc process failed : External Process Failed : bib2Marc process "
    "failed. No records exported, check parameters"
)
ERROR_NAMES = {
    106: "Parameter not recognized", 107: "Record not found", 108: "Invalid parameter",
    111: "Internal server error", 113: "Unauthorized", 120: "Unauthorized", 123: "Unauthorized",
    135: "External Process Failed", 138: "Rate exceeded for endpoint",
}
MARC_TYPES = ("application/marc-xml", "application/marc-json", "application/marc-in-json")
DEFAULT_FIELDS: tuple[str, ...] = (
    "id", "updatedDate", "createdDate", "deletedDate", "deleted", "suppressed", "available", "lang",
    "title", "author", "materialType", "bibLevel", "publishYear", "catalogDate", "country",
    "callNumber", "locations",
)
ALL_FIELDS: tuple[str, ...] = DEFAULT_FIELDS + ("normTitle", "normAuthor", "isbn", "fixedFields",
                                                "varFields", "marc")
_STUB_FIELDS = ("id", "deletedDate", "deleted")  # all a deleted bib ever shows
_BIBS_PARAMS = frozenset({"limit", "offset", "id", "fields", "updatedDate", "createdDate", "deletedDate",
                          "deleted", "suppressed"})
_EXPORT_PARAMS = frozenset({"id", "limit", "offset", "updatedDate", "mapping"})
_TIMESTAMP_RE = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z")
_DATE_RE = re.compile(r"\d{4}-\d{2}-\d{2}")
_BIB_PATH_RE = re.compile(r"/bibs/(\d+)(/marc)?")
_FILE_PATH_RE = re.compile(r"/bibs/marc/files/([A-Za-z0-9._-]+)")
_VAR_TAGS = {"001": "o", "020": "i", "100": "a", "245": "t", "260": "p", "264": "p", "650": "d"}
_NORM_RE = re.compile(r"[^\w ]+")


class Headers(Protocol):
    """What the simulator reads of a request's headers (http.server's message, or a dict)."""

    def get(self, name: str, /) -> str | None: ...


class ApiError(Exception):
    """A Sierra error answer: ``{"code","specificCode","httpStatus","name"[,"description"]}``."""

    def __init__(self, status: int, code: int, description: str | None = None,
                 name: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(description or ERROR_NAMES.get(code, ""))
        self.headers = headers or {}
        self.status = status
        self.code = code
        self.description = description
        self.name = name or ERROR_NAMES.get(code) or status_phrase(status)

    def body(self) -> dict[str, Any]:
        payload: dict[str, Any] = {"code": self.code, "specificCode": 0, "httpStatus": self.status,
                                   "name": self.name}
        if self.description is not None:
            payload["description"] = self.description
        return payload


@dataclass
class Response(loopback.Response):
    """A loopback response whose content type defaults to Sierra's JSON."""

    content_type: str = JSON_TYPE


@dataclass
class _Token:
    serial: int
    issued: int  # simulated epoch seconds


def _json(status: int, payload: Any, headers: dict[str, str] | None = None) -> Response:
    return Response(status, json.dumps(payload, ensure_ascii=False).encode(), JSON_TYPE, headers or {})


# ------------------------------------------------------------ parameter parsing
def _int_param(params: Mapping[str, str], name: str, default: int, minimum: int) -> int:
    text = params.get(name)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        raise ApiError(400, 108, f"Invalid parameter : {name} must be an integer") from None
    if value < minimum:
        raise ApiError(400, 108, f"Invalid parameter : {name} must be >= {minimum}")
    return value


def _bool_param(params: Mapping[str, str], name: str) -> bool | None:
    text = params.get(name)
    if text is None:
        return None
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    raise ApiError(400, 108, f"Invalid parameter : {name} must be true or false")


def _split_range(text: str) -> tuple[str, str] | None:
    """``[a,b]`` -> (a, b) with "" for an open end; a bare value -> None."""
    if text.startswith("[") and text.endswith("]"):
        parts = text[1:-1].split(",")
        if len(parts) != 2:
            raise ApiError(400, 108, f"Invalid parameter : bad range {text}")
        return parts[0].strip(), parts[1].strip()
    return None


def parse_ids(text: str) -> tuple[int | None, int | None, tuple[int, ...] | None]:
    """``a`` | ``a,b,c`` | ``[a,b]`` | ``[a,]`` | ``[,b]`` -> (low, high, list)."""
    bounds = _split_range(text.strip())
    try:
        if bounds is not None:
            low, high = (int(b) if b else None for b in bounds)
            return low, high, None
        items = [part.strip() for part in text.split(",") if part.strip()]
        if not items or not all(part.isdigit() for part in items):
            raise ValueError(text)
        return None, None, tuple(int(part) for part in items)
    except ValueError:
        raise ApiError(400, 108, f"Invalid parameter : invalid id {text}") from None


def _epoch_of(text: str, upper: bool, dates_only: bool) -> int:
    if not dates_only and _TIMESTAMP_RE.fullmatch(text):
        moment = datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
        return int(moment.timestamp())
    if _DATE_RE.fullmatch(text):
        moment = datetime.strptime(text, "%Y-%m-%d").replace(tzinfo=timezone.utc)
        return int(moment.timestamp()) + (86399 if upper else 0)
    raise ValueError(text)


def parse_date_range(text: str, dates_only: bool = False) -> tuple[int, int]:
    """An updatedDate/createdDate (or, with `dates_only`, deletedDate) value as
    inclusive epoch bounds. Timestamps need the ``Z``; a date covers its whole day."""
    text = text.strip()
    try:
        bounds = _split_range(text)
        if bounds is None:
            return _epoch_of(text, False, dates_only), _epoch_of(text, True, dates_only)
        low = _epoch_of(bounds[0], False, dates_only) if bounds[0] else -(2**62)
        high = _epoch_of(bounds[1], True, dates_only) if bounds[1] else 2**62
        return low, high
    except ValueError:
        kind = "date (YYYY-MM-DD)" if dates_only else "date or timestamp (YYYY-MM-DDThh:mm:ssZ)"
        raise ApiError(400, 108, f"Invalid parameter : expected a {kind} in {text}") from None


def _days(bounds: tuple[int, int]) -> tuple[int, int]:
    return bounds[0] // 86400, bounds[1] // 86400


def parse_fields(text: str | None) -> tuple[str, ...] | str:
    """Field names to render, or "all" for the ``fields=,`` form."""
    if text is None or not text.strip():
        return DEFAULT_FIELDS
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        return "all"
    wanted: set[str] = {"id"}
    for name in names:
        if name == "default":
            wanted.update(DEFAULT_FIELDS)
        elif name in ALL_FIELDS:
            wanted.add(name)
        else:
            raise ApiError(400, 108, f"Invalid parameter : Invalid field name: {name}")
    return tuple(n for n in ALL_FIELDS if n in wanted)


# -------------------------------------------------------------- entry rendering
def _norm(text: str) -> str:
    return " ".join(_NORM_RE.sub(" ", text.lower()).split())


def _call_number(bib: Bib) -> str:
    cutter = f"{bib.author[0]}{bib.number % 90 + 10}"
    return f"{bib.subject[:2].upper()}{bib.number % 900 + 100} .{cutter} {bib.publish_year}"


def _fixed_fields(bib: Bib) -> dict[str, dict[str, Any]]:
    return {
        "24": {"label": "LANG", "value": bib.lang[0]},
        "26": {"label": "LOCATION", "value": bib.location},
        "27": {"label": "COPIES", "value": bib.items},
        "28": {"label": "CAT. DATE", "value": day_text(bib.created)},
        "29": {"label": "BIB LVL", "value": "m"},
        "30": {"label": "MAT TYPE", "value": bib.material_type[0]},
        "31": {"label": "BCODE3", "value": bib.bcode3},
        "80": {"label": "REC TYPE", "value": "b"},
        "83": {"label": "CREATED", "value": iso_z(bib.created)},
        "84": {"label": "UPDATED", "value": iso_z(bib.updated)},
        "85": {"label": "REVISIONS", "value": bib.version},
        "89": {"label": "COUNTRY", "value": bib.country[0]},
    }


def _var_fields(bib: Bib) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"fieldTag": "_", "content": marc.leader_for(bib)}]
    for f in marc.marc_fields(bib, export=False):
        tag = f[0]
        if len(f) == 2:
            out.append({"fieldTag": _VAR_TAGS.get(tag, "y"), "marcTag": tag, "content": f[1]})
        else:
            out.append({"fieldTag": _VAR_TAGS.get(tag, "y"), "marcTag": tag, "ind1": f[1], "ind2": f[2],
                        "subfields": [{"tag": code, "content": value} for code, value in f[3]]})
    return out


_RENDER: dict[str, Callable[[Bib], Any]] = {
    "id": lambda b: b.id,
    "updatedDate": lambda b: iso_z(b.updated),
    "createdDate": lambda b: iso_z(b.created),
    "deletedDate": lambda b: None,  # live bibs have none
    "deleted": lambda b: False,
    "suppressed": lambda b: b.suppressed,
    "available": lambda b: b.items > 0,
    "lang": lambda b: {"code": b.lang[0], "name": b.lang[1]},
    "title": lambda b: None if b.invalid else b.title,
    "author": lambda b: b.author,
    "materialType": lambda b: {"code": b.material_type[0], "value": b.material_type[1]},
    "bibLevel": lambda b: {"code": "m", "value": "MONOGRAPH"},
    "publishYear": lambda b: b.publish_year,
    "catalogDate": lambda b: day_text(b.created),
    "country": lambda b: {"code": b.country[0].strip(), "name": b.country[1]},
    "callNumber": _call_number,
    "locations": lambda b: [{"code": b.location, "name": b.location.title()}],
    "normTitle": lambda b: None if b.invalid else _norm(b.title),
    "normAuthor": lambda b: _norm(b.author),
    "isbn": lambda b: b.isbn,
    "fixedFields": _fixed_fields,
    "varFields": _var_fields,
    "marc": lambda b: None if b.no_marc else marc.marc_in_json(b, zero_leader=True),
}


def render_entry(bib: Bib, names: tuple[str, ...]) -> dict[str, Any]:
    """One ``entries`` item; a deleted bib only ever shows id, deletedDate and deleted."""
    if bib.deleted:
        stub = {"id": bib.id, "deletedDate": str(bib.deleted_date), "deleted": True}
        return {k: v for k, v in stub.items() if k in names}
    entry = {}
    for name in names:
        value = _RENDER[name](bib)
        if value is not None:
            entry[name] = value
    return entry


# ------------------------------------------------------------------ simulator
class SierraSimulator(ControlledServer[SierraFaults]):
    """Serve `catalogue` as a Sierra REST API on loopback; use as a context manager.

    `faults` (or its fields as keywords: ``export_quota=100``) are the switches it starts
    with; ``set_faults`` and ``POST /_control/faults`` change them while it runs.
    An export block is the lowest ``limit`` ids of the range, deleted bibs included (as
    on a real server): they count in ``inputRecords``, not in ``outputRecords``.
    ``keep_alive_timeout``/``keep_alive_max``: idle connections close after this many
    wall-clock seconds (Apache's default, announced as ``Keep-Alive: timeout=5``); a
    connection closes after this many requests (loopback.py; None: never).
    """

    _base_path = API_PATH
    _thread_prefix = "sierra-simulator"
    _json_reply = staticmethod(_json)
    _fault_actions = FAULT_ACTIONS

    def __init__(self, catalogue: SimulatedCatalogue, host: str = "127.0.0.1", port: int = 0,
                 client_key: str = "demo-key", client_secret: str = "demo-secret", token_lifetime: int = 3600,
                 *, keep_alive_timeout: float | None = 5.0, keep_alive_max: int | None = 100,
                 faults: SierraFaults | None = None, **switches: Any) -> None:
        super().__init__(host, port, _Handler, catalogue, (faults or SierraFaults()).changed(**switches),
                         keep_alive_timeout=keep_alive_timeout, keep_alive_max=keep_alive_max)
        self.catalogue = catalogue
        self.client_key = client_key
        self.client_secret = client_secret
        self.token_lifetime = token_lifetime
        self.tokens_issued = 0
        self.exports_created = 0
        self._tokens: dict[str, _Token] = {}
        self._revoked_through = 0  # tokens with serial <= this were expired by expire_tokens()
        self._files: dict[str, bytes] = {}
        self._file_seq = 0
        self._quota_start: int | None = None
        self._quota_used = 0
        self._export_cache: dict[Bib, tuple[bytes, bool]] | None = None

    # ---------------------------------------------------------------- state
    @property
    def open_export_files(self) -> list[str]:
        """Export files generated and not yet DELETEd (names as in the file URL)."""
        with self._lock:
            return sorted(self._files)

    def http_date(self) -> str:
        """RFC 7231 date of the simulated clock, for the Date header."""
        return formatdate(self.catalogue.clock_epoch, usegmt=True)

    # --------------------------------------------------------- misbehaviour
    # Shorthands for set_faults, in the words tests and benchmarks use (faults.py has the
    # full story of each switch; a new fault needs none).
    def fail_next(self, count: int, status: int = 500, body: Any = None,
                  path_prefix: str | None = None, retry_after: str | int | None = None) -> None:
        self.set_faults(fail_next=Failure(count=count, status=status, body=body, path_prefix=path_prefix,
                                          retry_after=retry_after))

    def empty_reply_next(self, count: int = 1) -> None:
        self.set_faults(empty_reply_next=Shot(count=count))

    def hang_next(self, seconds: float = 600.0) -> None:
        self.set_faults(hang_next=seconds)

    def fail_export_next(self, code: int = 135, count: int = 1) -> None:
        self.set_faults(fail_export_next=ExportFailure(code=code, count=count))

    def rate_limit_once(self, after: int, seconds: int = 3600, style: str = "138") -> None:
        self.set_faults(rate_limit_once=RateLimitOnce(after=after, seconds=seconds, style=style))

    def expire_tokens(self) -> None:
        """Every token issued so far is invalid from now on (a mid-run expiry)."""
        with self._lock:
            self._revoked_through = self.tokens_issued

    def reset_export_quota(self) -> None:
        """Forget the exports counted against the current quota hour."""
        with self._lock:
            self._quota_start = None
            self._quota_used = 0

    def _fault_response(self, fail: Failure) -> Response:
        headers = {"Retry-After": str(fail.retry_after)} if fail.retry_after is not None else {}
        if isinstance(fail.body, bytes):
            return Response(fail.status, fail.body, "text/html; charset=utf-8", headers)
        if fail.body is not None:
            return _json(fail.status, fail.body, headers)
        code = 111 if fail.status == 500 else 0
        return _json(fail.status, {"code": code, "specificCode": 0, "httpStatus": fail.status,
                                   "name": ERROR_NAMES[111] if code else status_phrase(fail.status)}, headers)

    # --------------------------------------------------------------- request
    def handle(self, method: str, path: str, query: str, headers: Headers,
               body: bytes) -> Response | tuple[str, Any]:
        """Answer one API request; a ("empty"|"hang", detail) tuple means do not answer."""
        pairs = parse_qsl(query, keep_blank_values=True)
        entry = {"method": method, "path": path, "query": query_log_form(pairs),
                 "had_auth": bool(headers.get("Authorization")), "status": None}
        with self._lock:
            self.requests.append(entry)
        target = f"{path}?{query}" if query else path
        mode, detail = self.take_fault("empty_reply_next", "hang_next", "fail_next",
                                       applies=lambda name, fault: name != "fail_next" or fault.matches(target))
        if mode == "empty_reply_next":
            return "empty", None
        if mode == "hang_next":
            return "hang", detail
        if mode == "fail_next":
            response = self._fault_response(detail)
        else:
            try:
                response = self._route(method, path, dict(reversed(pairs)), headers, body)
            except ApiError as exc:
                payload = exc.body()
                if self.faults.specific_code:
                    payload["specificCode"] = self.faults.specific_code
                response = _json(exc.status, payload, exc.headers)
        entry["status"] = response.status
        return response

    def _route(self, method: str, path: str, params: dict[str, str], headers: Headers,
               body: bytes) -> Response:
        for prefix in _API_PATHS:
            if path.startswith(prefix + "/"):
                rest = path[len(prefix):]
                break
        else:
            raise ApiError(404, 0, "No such endpoint", name="Not Found")
        if rest == "/token":
            self._only(method, "POST")
            return self._issue_token(headers, body)
        token = self._authorize(headers)
        if rest == "/info/token":
            self._only(method, "GET")
            return self._token_info(token)
        if rest == "/bibs":
            self._only(method, "GET")
            return self._bibs(params)
        if rest in ("/items", "/holdings"):
            self._only(method, "GET")
            return self._attached(rest[1:], params)
        if rest == "/bibs/query":
            if method == "GET":
                raise ApiError(400, 106)
            self._only(method, "POST")
            return self._query(params, body)
        if rest == "/bibs/marc":
            if method == "DELETE":
                raise ApiError(403, 0, "Deleting exports in bulk is not permitted", name="Forbidden")
            self._only(method, "GET")
            return self._export(params)
        match = _FILE_PATH_RE.fullmatch(rest)
        if match:
            return self._file(method, match.group(1))
        match = _BIB_PATH_RE.fullmatch(rest)
        if match:
            self._only(method, "GET")
            if match.group(2):
                return self._bib_marc(match.group(1), params, headers)
            return self._bib(match.group(1), params)
        raise ApiError(404, 0, "No such endpoint", name="Not Found")

    @staticmethod
    def _only(method: str, allowed: str) -> None:
        if method != allowed:
            raise ApiError(405, 0, f"Use {allowed}", name="Method Not Allowed")

    @staticmethod
    def _check_params(params: Mapping[str, str], allowed: frozenset[str]) -> None:
        unknown = sorted(set(params) - allowed)
        if unknown:
            raise ApiError(400, 106, f"Parameter not recognized: {unknown[0]}")

    # ----------------------------------------------------------------- auth
    def _issue_token(self, headers: Headers, body: bytes) -> Response:
        scheme, _, credentials = (headers.get("Authorization") or "").partition(" ")
        try:
            key, _, secret = base64.b64decode(credentials.strip(), validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            key = secret = ""
        if scheme.lower() != "basic" or (key, secret) != (self.client_key, self.client_secret):
            raise ApiError(401, 113, "Invalid or missing authorization header")
        form = dict(parse_qsl(body.decode("utf-8", "replace")))
        if form.get("grant_type", "client_credentials") != "client_credentials":
            raise ApiError(400, 108, "Invalid parameter : unsupported grant_type")
        now = self.catalogue.clock_epoch
        with self._lock:
            self.tokens_issued += 1
            serial = self.tokens_issued
            token = hashlib.sha256(f"{self.client_key}:{serial}:{now}".encode()).hexdigest()[:48]
            self._tokens[token] = _Token(serial, now)
        return _json(200, {"access_token": token, "token_type": "bearer", "expires_in": self.token_lifetime})

    def _authorize(self, headers: Headers) -> _Token:
        scheme, _, token = (headers.get("Authorization") or "").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise ApiError(401, 113, "Invalid or missing authorization header")
        now = self.catalogue.clock_epoch
        with self._lock:
            issued = self._tokens.get(token)
            valid = (issued is not None and issued.serial > self._revoked_through
                     and now < issued.issued + self.token_lifetime)
        if not valid or issued is None:
            code = self.faults.expired_token_code
            raise ApiError(401, code, "invalid_grant" if code == 123 else "invalid_token")
        return issued

    def _token_info(self, token: _Token) -> Response:
        remaining = token.issued + self.token_lifetime - self.catalogue.clock_epoch
        return _json(200, {
            "keyId": self.client_key, "grantType": "client_credentials", "authorizationScheme": "Bearer",
            "expiresIn": remaining,
            "roles": [{"name": "Bibs_Read", "tokenLifetime": self.token_lifetime,
                       "permissions": [{"name": "Bibs_Read", "operation": "read"}]}],
        })

    # ----------------------------------------------------------------- bibs
    def _bib_query(self, params: Mapping[str, str]) -> BibQuery:
        low = high = None
        id_list = None
        if "id" in params:
            low, high, id_list = parse_ids(params["id"])
        return BibQuery(
            id_low=low, id_high=high, id_list=id_list,
            updated=parse_date_range(params["updatedDate"]) if "updatedDate" in params else None,
            created=parse_date_range(params["createdDate"]) if "createdDate" in params else None,
            deleted_days=(_days(parse_date_range(params["deletedDate"], dates_only=True))
                          if "deletedDate" in params else None),
            deleted=_bool_param(params, "deleted"), suppressed=_bool_param(params, "suppressed"),
            legacy_deleted_stubs=self.faults.legacy_deleted_stubs,
        )

    def _bibs(self, params: Mapping[str, str]) -> Response:
        self._check_params(params, _BIBS_PARAMS)
        limit = min(_int_param(params, "limit", DEFAULT_LIMIT, 1), MAX_LIMIT)  # silently capped
        offset = _int_param(params, "offset", 0, 0)
        names = parse_fields(params.get("fields"))
        query = self._bib_query(params)
        faults = self.faults
        if isinstance(names, str):  # "all": the fields=, form
            if query.deleted:
                raise ApiError(500, 111)  # production answers fields=,&deleted=true with a bare 500
            names = tuple(n for n in ALL_FIELDS if n != "deletedDate")
        numbers = self.catalogue.select(query, offset, limit)
        if not numbers:
            if query.deleted and query.deleted_days is not None:
                return _json(200, {"start": offset, "entries": []} if faults.list_start else {"entries": []})
            raise ApiError(404, 107)
        bibs = self.catalogue.bibs(numbers)
        if faults.poison_json_fails and query.id_list and any(self.catalogue.is_poison(b.number) for b in bibs):
            raise ApiError(500, 111, "Internal server error : unable to read the MARC record")
        entries = [self._shape(bib, render_entry(bib, names)) for bib in bibs]
        body: dict[str, Any] = {"total": len(entries), "start": offset, "entries": entries}
        if not faults.list_start:
            del body["start"]
        return _json(200, body)

    def _attached(self, kind: str, params: Mapping[str, str]) -> Response:
        """GET items / holdings: the bibs' list semantics (keyset by id, 404/107 for an empty
        change window, 200 with no entries for an empty deletion day, date-only deletedDate,
        legacy deleted stubs in a change window) over the catalogue's AttachedSet."""
        attached = self.catalogue.attached.get(kind)
        if attached is None:
            raise ApiError(404, 107)
        self._check_params(params, _BIBS_PARAMS)
        limit = min(_int_param(params, "limit", DEFAULT_LIMIT, 1), MAX_LIMIT)
        offset = _int_param(params, "offset", 0, 0)
        text = params.get("fields")
        if text is None or not text.strip():
            names: tuple[str, ...] = attached.default_fields
        else:
            asked = [n.strip() for n in text.split(",") if n.strip()]
            unknown = [n for n in asked if n not in attached.fields]
            if unknown:
                raise ApiError(400, 108, f"Invalid parameter : Invalid field name: {unknown[0]}")
            names = tuple(dict.fromkeys(["id", *asked]))
        query = self._bib_query(params)
        found = attached.select(query, offset, limit)
        faults = self.faults
        if not found:
            if query.deleted and query.deleted_days is not None:
                return _json(200, {"start": offset, "entries": []} if faults.list_start else {"entries": []})
            raise ApiError(404, 107)
        entries = [attached.render(i, names, faults.mixed_fixed_types) for i in found]
        body: dict[str, Any] = {"total": len(entries), "start": offset, "entries": entries}
        if not faults.list_start:
            del body["start"]
        return _json(200, body)

    def _shape(self, bib: Bib, entry: dict[str, Any]) -> dict[str, Any]:
        """The recorded real-server shapes this simulator was asked to vary (see the class doc)."""
        if bib.deleted:
            return entry
        faults = self.faults
        if "marc" in entry:
            entry["marc"] = self._shape_marc(bib, entry["marc"])
        if faults.padded_codes:
            for name, width in (("materialType", 3), ("country", 3), ("lang", 3)):
                if isinstance(entry.get(name), dict) and "code" in entry[name]:
                    entry[name]["code"] = str(entry[name]["code"]).ljust(width)
        fixed = entry.get("fixedFields")
        if isinstance(fixed, dict):
            for key, field in fixed.items():
                value = field.get("value")
                if faults.padded_codes and key in ("30", "89", "24") and isinstance(value, str):
                    field["value"] = value.ljust(3)
                if faults.mixed_fixed_types:
                    if isinstance(value, int) and int(key) % 2:
                        field["value"] = str(value)  # some sites' fixed fields are all strings
                    elif isinstance(value, str) and value.isdigit() and not int(key) % 2:
                        field["value"] = int(value)
        return entry

    def _shape_marc(self, bib: Bib, record: dict[str, Any]) -> dict[str, Any]:
        faults = self.faults
        fields = list(record.get("fields") or [])
        if faults.marc_storage_order and fields:
            turn = bib.number % len(fields)
            fields = fields[turn:] + fields[:turn]  # storage order: control fields amid the data fields
        leader = record.get("leader", "")
        place = bib.number - self.catalogue.first_id + 1
        if faults.empty_leader_every and place % faults.empty_leader_every == 0:
            leader = ""
        elif faults.blank_leader_every and place % faults.blank_leader_every == 0:
            leader = " " * 24
        return {"leader": leader, "fields": fields}

    def _bib(self, bib_id: str, params: Mapping[str, str]) -> Response:
        self._check_params(params, frozenset({"fields"}))
        names = parse_fields(params.get("fields"))
        bib = self.catalogue.get(bib_id)
        if bib is None:
            raise ApiError(404, 107)
        if isinstance(names, str):  # "all": the fields=, form
            names = tuple(n for n in ALL_FIELDS if n != "deletedDate")
        return _json(200, render_entry(bib, names))

    def _bib_marc(self, bib_id: str, params: Mapping[str, str], headers: Headers) -> Response:
        self._check_params(params, frozenset())
        accepted = [part.split(";")[0].strip().lower() for part in (headers.get("Accept") or "").split(",")]
        kind = next((a for a in accepted if a in MARC_TYPES), None)
        if kind is None:
            raise ApiError(400, 108, "Unknown content type")
        bib = self.catalogue.get(bib_id)
        if bib is None or bib.deleted or bib.no_marc:
            raise ApiError(404, 107)
        if kind == "application/marc-xml":
            return Response(200, marc.marc_xml(bib), f"{kind};charset=UTF-8")
        return Response(200, json.dumps(self._shape_marc(bib, marc.marc_in_json(bib)), ensure_ascii=False).encode(),
                        f"{kind};charset=UTF-8")

    # ---------------------------------------------------------------- query
    def _query(self, params: Mapping[str, str], body: bytes) -> Response:
        self._check_params(params, frozenset({"offset", "limit"}))
        limit = min(_int_param(params, "limit", DEFAULT_LIMIT, 1), MAX_LIMIT)
        offset = _int_param(params, "offset", 0, 0)
        try:
            predicate = _compile_query(json.loads(body or b"null"))
        except (ValueError, KeyError, TypeError, IndexError) as exc:
            raise ApiError(400, 108, f"Invalid parameter : invalid JSON query ({exc})") from None
        catalogue = self.catalogue
        live = [int(i) for i in catalogue.sorted_live_ids()]
        hits = [bib.id for bib in catalogue.bibs(live) if predicate(bib)][offset:offset + limit]
        entries = [{"link": f"{self.base_url}/bibs/{bib_id}"} for bib_id in hits]
        return _json(200, {"total": len(entries), "start": offset, "entries": entries})

    # --------------------------------------------------------------- export
    def _export(self, params: Mapping[str, str]) -> Response:
        self._check_params(params, _EXPORT_PARAMS)
        limit = min(_int_param(params, "limit", DEFAULT_LIMIT, 1), MAX_LIMIT)
        offset = _int_param(params, "offset", 0, 0)
        query = self._bib_query(params)
        now = self.catalogue.clock_epoch
        with self._lock:
            _, failure = self._spend_fault("fail_export_next")
            if failure is not None:
                raise ApiError(500, failure.code, EXPORT_FAILED_135 if failure.code == 135 else None)
            limit_once = self.faults.rate_limit_once
            if limit_once is not None:
                waited = limit_once.model_copy(update={"after": limit_once.after - 1}) if limit_once.after else None
                self.faults = self.faults.model_copy(update={"rate_limit_once": waited})
                if waited is None:
                    raise self._rate_limited(limit_once.style, limit_once.seconds)
            faults = self.faults
            if self._quota_start is None or now >= self._quota_start + HOUR:
                self._quota_start, self._quota_used = now, 0
            if faults.export_quota is not None and self._quota_used >= faults.export_quota:
                raise self._rate_limited(faults.rate_limit_style, self._quota_start + HOUR - now)
            self._quota_used += 1
        block = self.catalogue.bibs(self.catalogue.select(replace(query, deleted=None), offset, limit))
        if not block and not faults.empty_export_file:
            raise ApiError(404, 107)
        if any(self.catalogue.is_poison(bib.number) for bib in block if not bib.deleted):
            raise ApiError(500, 135, EXPORT_FAILED_135)  # on every try, as long as the block holds it
        deleted = sum(1 for bib in block if bib.deleted)
        output = [bib for bib in block if not bib.deleted and not bib.no_marc
                  and not (bib.suppressed and faults.export_omits_suppressed)]
        records = [self._export_record(bib) for bib in output]
        data = b"".join(r for r, _ in records)
        summary: dict[str, Any] = {"inputRecords": len(block), "outputRecords": len(records),
                                   "errors": sum(1 for _, cut in records if cut)}
        if faults.deleted_records_field == "always" or (faults.deleted_records_field == "nonzero" and deleted):
            summary["deletedRecords"] = deleted
        with self._lock:
            self._file_seq += 1
            self.exports_created += 1
            name = f"{datetime.fromtimestamp(now, timezone.utc):%Y%m%dT%H%M%S}-bibs-{self._file_seq}.mrc"
            if faults.export_file_ids != "named":
                name = f"{self._file_seq}.mrc"
            self._files[name] = data
        origin = f"{faults.file_origin}{API_PATH}" if faults.file_origin else self.base_url
        if faults.export_file_ids == "bare":
            return _json(200, {"file": name.removesuffix(".mrc"), **summary})
        shown = name.removesuffix(".mrc") if faults.export_file_ids == "numeric" else name
        return _json(200, {"file": f"{origin}/bibs/marc/files/{shown}", **summary})

    def _export_record(self, bib: Bib) -> tuple[bytes, bool]:
        cached = self._export_cache.get(bib) if self._export_cache is not None else None
        if cached is None:
            cached = marc.export_record(bib)
            if self._export_cache is not None:
                self._export_cache[bib] = cached
        return cached

    def warm_export(self) -> int:
        """Encode every bib's export record now and keep them (keyed by the immutable Bib).

        For benchmarks: the simulator's pure-Python MARC encoder then costs nothing during
        a measured full load, so the harvester (not the simulator) is measured. Off by default.
        """
        catalogue = self.catalogue
        cache: dict[Bib, tuple[bytes, bool]] = {}
        for bib in catalogue.bibs(catalogue.select(BibQuery(), 0, None)):
            if not bib.deleted:
                cache[bib] = marc.export_record(bib)
        with self._lock:
            self._export_cache = cache
        return len(cache)

    @staticmethod
    def _rate_limited(style: str, seconds: int) -> ApiError:
        """Sierra's own 138 (wait in minutes, in words), or a gateway's 429 with Retry-After."""
        if style == "429":
            return ApiError(429, 0, "Too many requests", name="Too Many Requests",
                            headers={"Retry-After": str(max(1, int(seconds)))})
        minutes = math.ceil(seconds / 60)
        return ApiError(500, 138, f"Rate exceeded for endpoint. Try again in {minutes} minutes")

    def _file(self, method: str, name: str) -> Response:
        if not name.endswith(".mrc"):
            name += ".mrc"
        with self._lock:
            data = self._files.get(name)
            if data is not None and method == "DELETE":
                del self._files[name]
        if data is None:
            raise ApiError(404, 107)
        if method == "DELETE":
            return Response(204, b"", "")
        self._only(method, "GET")
        return Response(200, data, "application/octet-stream")

    # --------------------------------------------------------- control API
    def _report(self, action: str) -> Response | None:
        catalogue = self.catalogue
        if action in ("live_ids", "deleted_ids", "public_ids"):
            ids = (catalogue.sorted_live_ids() if action == "live_ids" else
                   sorted(catalogue.deleted_ids() if action == "deleted_ids" else catalogue.public_ids()))
            return Response(200, "".join(f"{i}\n" for i in ids).encode(), "text/plain; charset=utf-8")
        if action == "state":
            with self._lock:
                state = {"tokens_issued": self.tokens_issued, "requests": len(self.requests),
                         "open_export_files": sorted(self._files), "exports_created": self.exports_created,
                         "export_quota": self.faults.export_quota, "exports_this_hour": self._quota_used,
                         "errors": list(self.errors),
                         # the CPU this simulator's process used so far (benchmarks show its share)
                         "process_cpu_seconds": time.process_time()}
            return _json(200, {**catalogue.counts(), "clock": iso_z(catalogue.clock_epoch),
                               "base_url": self.base_url, **state})
        return None

    def _control_suppress(self, data: dict[str, Any]) -> dict[str, Any]:
        return {"changed": self.catalogue.suppress(list(data["ids"]), bool(data.get("on", True)))}

    def _control_strip_marc(self, data: dict[str, Any]) -> dict[str, Any]:
        return {"changed": self.catalogue.strip_marc(list(data["ids"]), bool(data.get("touch", True)))}

    def _control_expire_tokens(self, data: dict[str, Any]) -> dict[str, Any]:
        self.expire_tokens()
        return {"ok": True}

    def _control_reset_export_quota(self, data: dict[str, Any]) -> dict[str, Any]:
        self.reset_export_quota()
        return {"ok": True}

    def _control_warm_export(self, data: dict[str, Any]) -> dict[str, Any]:
        return {"ok": True, "encoded": self.warm_export()}


# ------------------------------------------------------------- JSON queries
_FIXED_FIELD_VALUES: dict[int, Callable[[Bib], str]] = {
    24: lambda b: b.lang[0], 26: lambda b: b.location, 30: lambda b: b.material_type[0],
    31: lambda b: b.bcode3, 83: lambda b: day_text(b.created), 84: lambda b: day_text(b.updated),
}
_OPS: dict[str, Callable[[str, list[str]], bool]] = {
    "equals": lambda v, o: v in o, "not_equal": lambda v, o: v not in o,
    "greater_than": lambda v, o: v > o[0], "less_than": lambda v, o: v < o[0],
    "greater_than_or_equal": lambda v, o: v >= o[0], "less_than_or_equal": lambda v, o: v <= o[0],
    "between": lambda v, o: o[0] <= v <= o[1],
}


def _both(left: Callable[[Bib], bool], right: Callable[[Bib], bool]) -> Callable[[Bib], bool]:
    return lambda b: left(b) and right(b)


def _either(left: Callable[[Bib], bool], right: Callable[[Bib], bool]) -> Callable[[Bib], bool]:
    return lambda b: left(b) or right(b)


def _compile_query(node: Any) -> Callable[[Bib], bool]:
    """A Create-Lists JSON query over a few fixed fields (84 updated, 83 created,
    31 BCODE3, 24 lang, 26 location, 30 mat type); dates compare as YYYY-MM-DD."""
    if isinstance(node, dict) and "queries" in node:
        parts = node["queries"]
        result = _compile_query(parts[0])
        for joiner, part in zip(parts[1::2], parts[2::2]):
            left, right = result, _compile_query(part)
            if joiner == "and":
                result = _both(left, right)
            elif joiner == "or":
                result = _either(left, right)
            else:
                raise ValueError(f"unknown joiner {joiner!r}")
        return result
    target, expr = node["target"], node["expr"]
    if target["record"]["type"] != "bib":
        raise ValueError("only bib targets are simulated")
    value_of = _FIXED_FIELD_VALUES[int(target["id"])]
    op = _OPS[expr["op"]]
    operands = [str(o) for o in expr["operands"]]
    return lambda bib: op(value_of(bib), operands)


# --------------------------------------------------------------------- HTTP
class _Handler(LoopbackHandler):
    server_version = "SierraSimulator/1.0"

    @property
    def sim(self) -> SierraSimulator:
        return cast(SierraSimulator, self.server.sim)

    def version_string(self) -> str:
        return self.server_version

    def date_time_string(self, timestamp: float | None = None) -> str:
        """The Date header comes from the simulated clock."""
        return self.sim.http_date()

    def do_GET(self) -> None:  # every method reads a body, GET included
        self._dispatch(self._read_body())

    do_DELETE = do_PUT = LoopbackHandler.do_POST

    def _respond(self, url: SplitResult, body: bytes | None) -> loopback.Response | None:
        sim, body = self.sim, body or b""
        if url.path.startswith(CONTROL_PREFIX):
            return sim.handle_control(self.command, url.path[len(CONTROL_PREFIX):], body)
        result = sim.handle(self.command, url.path, url.query, self.headers, body)
        if isinstance(result, tuple):
            mode, detail = result
            if mode == "hang":
                sim._stopping.wait(detail)
            self.close_connection = True  # no status line at all: an "empty reply"
            return None
        return result

    def _send(self, response: loopback.Response) -> None:
        self.send_response(response.status)
        if response.content_type:
            self.send_header("Content-Type", response.content_type)
        for name, value in response.headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(response.body)))
        self.end_headers()
        self.wfile.write(response.body)
