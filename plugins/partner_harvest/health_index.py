"""The health index's query: filter, sort and page the partners' health rows.

At thousands of partners the index cannot be one table (1.27 MB at 1,000 partners): the
server sends one page, sorted and filtered as the operator asked in the URL
(``?state=failing&protocol=sierra&q=museum&sort=lag&order=desc&page=2&per_page=100``).
The protocol filter is applied to the registry before any figure is read; the state, the
text (which also matches a failing partner's cause: "connection refused" finds every
partner of a shared outage) and the sort need each partner's state, so they run on the
rows ``store.health.partner_health`` returns. Plain Python, no Airflow, no database.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any
from urllib.parse import urlencode

from partner_harvest import partner_state
from partner_harvest.registry import Partner
from partner_harvest.store.health import PartnerHealth

PER_PAGE = 50
MAX_PER_PAGE = 500
ORDERS = ("asc", "desc")


def _lag(h: PartnerHealth) -> tuple[int, timedelta]:
    # Without a cursor the lag is unknown: last in either order's natural reading (ascending).
    return (1, timedelta(0)) if h.cursor_lag is None else (0, h.cursor_lag)


def _last_run(h: PartnerHealth) -> tuple[int, float]:
    return (1, 0.0) if h.last_run is None else (0, h.last_run.started_at.timestamp())


# Every sort ends on the partner id, so a page is the same page on every request.
SORTS: dict[str, Callable[[PartnerHealth], Any]] = {
    "state": lambda h: (partner_state.NAMES.index(h.state), h.partner_id),
    "name": lambda h: h.partner_id,
    "lag": lambda h: (_lag(h), h.partner_id),
    "records": lambda h: (h.records_held, h.partner_id),
    "quarantined": lambda h: (h.quarantined_now, h.partner_id),
    "last_run": lambda h: (_last_run(h), h.partner_id),
}


@dataclass(frozen=True)
class IndexQuery:
    """What the operator asked for; anything unknown falls back to the default (never an error page)."""

    state: str | None = None
    protocol: str | None = None
    text: str = ""
    sort: str = "state"
    order: str = "asc"
    page: int = 1
    per_page: int = PER_PAGE

    @classmethod
    def from_params(cls, params: Mapping[str, str]) -> IndexQuery:
        def number(name: str, default: int) -> int:
            try:
                return int(params.get(name) or default)
            except ValueError:
                return default

        state = params.get("state") or None
        return cls(
            state=state if state in partner_state.NAMES else None,
            protocol=params.get("protocol") or None,
            text=(params.get("q") or "").strip()[:200],
            sort=str(params.get("sort")) if params.get("sort") in SORTS else "state",
            order=str(params.get("order")) if params.get("order") in ORDERS else "asc",
            page=max(1, number("page", 1)),
            per_page=min(MAX_PER_PAGE, max(10, number("per_page", PER_PAGE))),
        )

    def params(self, **changes: Any) -> dict[str, str]:
        """The URL parameters of this query with ``changes``, defaults left out."""
        query = replace(self, **changes)
        default = IndexQuery()
        values = {"state": query.state, "protocol": query.protocol, "q": query.text, "sort": query.sort,
                  "order": query.order, "page": query.page, "per_page": query.per_page}
        defaults = {"state": None, "protocol": None, "q": "", "sort": default.sort, "order": default.order,
                    "page": 1, "per_page": default.per_page}
        return {k: str(v) for k, v in values.items() if v != defaults[k]}

    def url(self, **changes: Any) -> str:
        params = self.params(**changes)
        return "?" + urlencode(params) if params else "?"

    def sort_url(self, column: str) -> str:
        """The header link: a click sorts by the column, a second click reverses it."""
        order = "desc" if self.sort == column and self.order == "asc" else "asc"
        return self.url(sort=column, order=order, page=1)


@dataclass(frozen=True)
class IndexPage:
    rows: list[PartnerHealth]
    query: IndexQuery
    matched: int  # rows after every filter
    total: int  # every partner (and invalid entry) in the registry
    counts: dict[str, int]  # per state, over the rows the protocol and text filters leave

    @property
    def pages(self) -> int:
        return max(1, -(-self.matched // self.query.per_page))

    @property
    def page(self) -> int:
        return min(self.query.page, self.pages)

    @property
    def first(self) -> int:
        """1-based position of the page's first row (0 when nothing matched)."""
        return 0 if not self.rows else (self.page - 1) * self.query.per_page + 1

    @property
    def last(self) -> int:
        return self.first + len(self.rows) - 1 if self.rows else 0


def partners_to_read(partners: Iterable[Partner], query: IndexQuery) -> list[Partner]:
    """The registry partners whose figures the page needs (the protocol filter, before any query)."""
    return [p for p in partners if query.protocol is None or p.protocol == query.protocol]


def _matches(h: PartnerHealth, text: str) -> bool:
    needle = text.casefold()
    return needle in h.partner_id.casefold() or (h.cause is not None and needle in h.cause.casefold())


def select_page(rows: Sequence[PartnerHealth], query: IndexQuery, total: int | None = None) -> IndexPage:
    """Filter (protocol, text, then state), sort and cut out the asked page (past the last: the last)."""
    kept = [h for h in rows if (query.protocol is None or h.protocol == query.protocol)
            and (not query.text or _matches(h, query.text))]
    counts = {state: 0 for state in partner_state.NAMES}
    for h in kept:
        counts[h.state] += 1
    if query.state is not None:
        kept = [h for h in kept if h.state == query.state]
    kept.sort(key=SORTS[query.sort], reverse=query.order == "desc")
    pages = max(1, -(-len(kept) // query.per_page))
    start = (min(query.page, pages) - 1) * query.per_page
    return IndexPage(kept[start:start + query.per_page], query, len(kept), len(rows) if total is None else total,
                     counts)
