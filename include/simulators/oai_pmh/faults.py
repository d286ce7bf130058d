"""Every way the OAI-PMH simulator misbehaves, as one object (``include/simulators/faults.py``).

Persistent switches hold until changed; the ``*_next`` faults are spent by the request
they hit; ``expire_tokens_after``, ``end_list_after`` and ``mutate_after_pages`` wait for
the next list chain and go with it.
"""

from __future__ import annotations

from typing import Any, Literal, get_args

from pydantic import Field, field_validator

from ..control import FaultAction
from ..faults import Faults, Frozen, Shot

# How the resumptionToken element is written. Real servers differ: whitespace around the
# token, CDATA, character references, comments mentioning a token (a harvester that reads
# the token off the raw bytes must not be misled). "varied" rotates the first five page by
# page; "stale-comment" leaves an old token in a comment on the last page, where the
# element is absent.
TokenMarkup = Literal["plain", "padded", "charrefs", "cdata", "decoy", "varied", "stale-comment"]
TOKEN_MARKUPS: tuple[str, ...] = get_args(TokenMarkup)
# completeListSize is optional (OAI-PMH 2.0, 3.5): a real repository may leave it out (I13).
# "understated": a tenth of the list (a broken count, or a chain that never ends)
ListSize = Literal["exact", "omitted", "understated"]
LIST_SIZES: tuple[str, ...] = get_args(ListSize)
# How a repository refuses a list request whose window it finds too large (users of other
# harvesters report HTTP 413 "please restrict the request period" from a national library
# and 422 on monthly windows from a research repository; others answer badArgument).
WindowRefusalStyle = Literal["413", "422", "badArgument"]
# The credential forms a repository may require (docs/operator/connections.md): HTTP Basic,
# a Bearer token, a header of its own (Axiell's Token), a query parameter (FOLIO's apikey).
CredentialForm = Literal["basic", "bearer", "header", "query"]
HostileKind = Literal["billion_laughs", "xxe"]
# Bodies that try to exhaust the harvesting worker rather than fool its parser.
AttackKind = Literal["gzip_bomb", "endless_body", "slow_drip", "deep_xml", "wide_xml", "many_attributes"]
ATTACK_KINDS: tuple[str, ...] = get_args(AttackKind)


class Failure(Shot):
    """An HTTP error with a small HTML body instead of the answer."""

    status: int = 503
    retry_after: int | str | None = None
    """A ``Retry-After`` header, as given."""


class WindowRefusal(Frozen):
    """Refuse list requests whose window is longer than `longer_than` seconds."""

    longer_than: int
    how: WindowRefusalStyle = "413"


class Credentials(Frozen):
    """What an OAI request must carry. ``basic``: login (`name`) and secret; ``bearer``:
    Authorization: Bearer; ``header``: header `name` carries the secret; ``query``: parameter
    `name` on every request, continuations too (taken off before the OAI-PMH arguments are
    checked, as an API gateway in front does)."""

    form: CredentialForm
    secret: str = ""
    name: str | None = None


class Attack(Shot):
    """A hostile body for the next request (of `verb`, if given).

    gzip_bomb: a gzip body of about size/1000 bytes that inflates to `size` bytes of XML
    whitespace (default 1 GiB); endless_body: XML that never ends; slow_drip: the real
    answer, one byte every `interval` seconds (with `headers`, the status line and headers
    drip too); deep_xml: elements nested `size` deep; wide_xml: `size` empty elements;
    many_attributes: `size` attributes, 1,000 per element."""

    kind: AttackKind
    size: int | None = None
    interval: float = 1.0
    verb: str | None = None
    headers: bool = False

    def fits(self, pairs: list[tuple[str, str]]) -> bool:
        return self.verb is None or ("verb", self.verb) in pairs


class Mutation(Frozen):
    """Staff work during a harvest: once the next list chain (of `verb`, if given) has
    served `pages` pages, edit/delete records before it serves the next one."""

    pages: int = Field(ge=1)
    edit: int = 0
    delete: int = 0
    edit_ids: tuple[str, ...] = ()
    delete_ids: tuple[str, ...] = ()
    verb: str | None = None

    @field_validator("edit_ids", "delete_ids", mode="before")
    @classmethod
    def _none_is_empty(cls, value: Any) -> Any:
        return () if value is None else value


class OaiFaults(Faults):
    """The OAI-PMH simulator's switches."""

    # -- every response, until changed
    response_delay_ms: float = Field(0.0, ge=0)
    """Every OAI response over HTTP waits this long first (a slow repository answers a page
    in 0.2-2 s); concurrent requests wait side by side; lowering it releases waiting ones."""
    token_markup: TokenMarkup = "plain"
    """How list pages write their resumptionToken."""
    list_size: ListSize = "exact"
    """completeListSize on resumptionTokens: exact, omitted (it is optional) or understated."""
    token_padding: int = Field(0, ge=0)
    """Bytes of filler every resumptionToken carries: nothing in OAI-PMH bounds a token's
    length, and a hostile (or careless) repository may hand out megabytes a page."""
    error_statuses: dict[str, int] = {}
    """OAI error code -> the HTTP status its (still OAI-PMH) error body is served with, as
    real servers answer a quiet window's noRecordsMatch with 422."""
    refuse_windows: WindowRefusal | None = None
    """Refuse ListRecords/ListIdentifiers whose window (``from`` or the oldest record to
    ``until`` or the clock) is longer: HTTP 413 or 422 with an HTML page, or badArgument."""
    repeat_token: bool = False
    """Continuation pages hand back the very token they were asked with."""
    empty_pages_with_token: bool = False
    """List responses hold no records but always a fresh token."""
    requery_pages: bool = False
    """New list chains re-run their query on every page (offset paging, as many
    database-backed servers do): a record edited past ``until`` or deleted mid-list shifts
    every later one back by one, so one of them is never served."""
    credentials: Credentials | None = None
    """OAI requests without this credential are answered 401 (none: every request is admitted)."""
    broken_verbs: dict[str, int] = {}
    """verb -> the HTTP status it always answers with an HTML page, the others as usual: a
    ListRecords that breaks while ListIdentifiers and GetRecord work, a GetRecord route that
    answers 403."""
    delete_on_get: frozenset[str] = frozenset()
    """Records deleted the moment their GetRecord arrives (one shot each): listed by
    ListIdentifiers and gone by the GetRecord that follows."""
    ignore_from: bool = False
    """ListRecords and ListIdentifiers accept ``from`` and list as if it were not given (a
    repository whose database query drops the argument): every incremental window lists
    everything up to ``until``."""
    announced_granularity: Literal["day", "seconds"] | None = None
    """What Identify declares (None: the repository's own granularity), while the lists keep
    accepting only the repository's: a day repository declaring seconds answers a
    seconds-granular ``from`` with badArgument."""
    # -- the next request(s)
    fail_next: Failure | None = None
    """The next `count` OAI requests get `status` with a small HTML body."""
    html_next: bool = False
    """The next OAI request gets 200 text/html (a CMS error page)."""
    broken_next: bool = False
    """The next OAI request gets 200 with XML cut off in the middle of a record."""
    hostile_next: HostileKind | None = None
    """The next OAI response carries a hostile DTD (entity expansion or an external entity)."""
    attack_next: Attack | None = None
    """The next OAI request (of its verb) gets a body built to exhaust the worker."""
    # -- the next list chain
    expire_tokens_after: int | None = Field(None, ge=1)
    """The next token chain dies once it has served this many pages."""
    end_list_after: int | None = Field(None, ge=1)
    """The next list chain ends silently after this many pages: no resumptionToken, while
    completeListSize still counts the whole list."""
    mutate_after_pages: Mutation | None = None
    """Staff edits and deletions between two pages of the next list chain (of its verb)."""


def _with_status(statuses: dict[str, int], code: str, status: int) -> dict[str, int]:
    """`statuses` with `code` served under `status` (200: the protocol's own again)."""
    return {**{k: v for k, v in statuses.items() if k != code}, **({} if int(status) == 200 else {code: status})}


# The fault actions that predate POST /_control/faults (benchmarks, scripts and tests post
# them): action -> the faults its JSON body sets. They answer {"ok": true}.
FAULT_ACTIONS: dict[str, FaultAction] = {
    "response_delay": lambda f, d: {"response_delay_ms": d["ms"]},
    "token_markup": lambda f, d: {"token_markup": d.get("markup", "plain")},
    "error_status": lambda f, d: {"error_statuses": _with_status(f.error_statuses, str(d["code"]), d["status"])},
    "refuse_windows": lambda f, d: {"refuse_windows": None if d.get("longer_than") is None else d},
    "repeat_token": lambda f, d: {"repeat_token": d.get("on", True)},
    "empty_pages_with_token": lambda f, d: {"empty_pages_with_token": d.get("on", True)},
    "requery_pages": lambda f, d: {"requery_pages": d.get("on", True)},
    "fail_next": lambda f, d: {"fail_next": d},
    "html_next": lambda f, d: {"html_next": True},
    "broken_next": lambda f, d: {"broken_next": True},
    "hostile_next": lambda f, d: {"hostile_next": d["kind"]},
    "attack_next": lambda f, d: {"attack_next": d},
    "expire_tokens_after": lambda f, d: {"expire_tokens_after": d["pages"]},
    "end_list_after": lambda f, d: {"end_list_after": d["pages"]},
    "mutate_after_pages": lambda f, d: {"mutate_after_pages": d},
    "require_credentials": lambda f, d: {"credentials": None if d.get("form") is None else {
        "form": d["form"], "secret": str(d.get("secret", "")),
        "name": d.get("login") if d["form"] == "basic" else d.get("name")}},
    "break_verb": lambda f, d: {"broken_verbs": {**{v: s for v, s in f.broken_verbs.items() if v != d["verb"]},
                                                 **({} if d.get("status", 500) is None
                                                    else {str(d["verb"]): int(d.get("status", 500))})}},
    "ignore_from": lambda f, d: {"ignore_from": d.get("on", True)},
    "announce_granularity": lambda f, d: {"announced_granularity": d.get("granularity")},
}
