"""Every way the Sierra simulator varies or misbehaves, as one object (``include/simulators/faults.py``).

The shapes were recorded from real servers (tests/fixtures/realworld/sierra); the
behaviours are the production ones of docs/design/sierra-real-world.md; the ``*_next``
faults are spent by the requests they hit. Poison bibs themselves belong to the catalogue
(``SimulatedCatalogue(poison_every=...)``): a ``bibs/marc`` block holding one answers 500
code 135 with production's long description.
"""

from __future__ import annotations

from typing import Any, Literal
from urllib.parse import unquote

from pydantic import Field, field_validator

from ..control import FaultAction
from ..faults import Faults, Frozen, Shot

RateLimitStyle = Literal["138", "429"]


class Failure(Shot):
    """`status` with `body` (JSON-encoded unless bytes; None: Sierra's own error body)
    instead of the answer, for requests whose path and query contain `path_prefix`."""

    status: int = 500
    body: Any = None
    path_prefix: str | None = None
    retry_after: int | str | None = None
    """A ``Retry-After`` header, as a gateway in maintenance sends with 503."""

    def matches(self, target: str) -> bool:
        return self.path_prefix is None or self.path_prefix in target or self.path_prefix in unquote(target)


class ExportFailure(Shot):
    """bibs/marc export requests get 500 with this Sierra code."""

    code: int = 135


class RateLimitOnce(Frozen):
    """The export request after the next `after` ones is rate limited, once, for `seconds`."""

    after: int = Field(0, ge=0)
    seconds: int = 3600
    style: RateLimitStyle = "138"


class SierraFaults(Faults):
    """The Sierra simulator's switches."""

    # -- shapes recorded from real servers
    list_start: bool = True
    """List bodies carry ``start``; off, only ``total`` and ``entries`` (2017 servers)."""
    specific_code: int = 0
    """Error bodies carry this ``specificCode`` instead of 0."""
    export_file_ids: Literal["named", "numeric", "bare"] = "named"
    """The export summary's ``file`` ends in a name (``...-bibs-1.mrc``), a bare number
    (``.../files/17``), or is only that number (``"17"``)."""
    marc_storage_order: bool = False
    """MARC-in-JSON fields in storage order, 001/005/008 amid the others, not by tag."""
    empty_leader_every: int = Field(0, ge=0)
    """Every n-th bib's MARC-in-JSON leader is "" (as a vendor sandbox serves)."""
    blank_leader_every: int = Field(0, ge=0)
    """Every n-th bib's MARC-in-JSON leader is 24 blanks."""
    padded_codes: bool = False
    """Codes padded to their width ("a  ", "gw "), in fixedFields too."""
    mixed_fixed_types: bool = False
    """fixedFields values are numbers or strings of digits by field."""
    # -- behaviours
    legacy_deleted_stubs: bool = False
    """updatedDate windows also return deletion stubs (2017 Sierra)."""
    expired_token_code: Literal[120, 123] = 123
    """An expired token's code: 123 ("invalid_grant", observed) or 120 ("invalid_token", documented)."""
    export_quota: int | None = Field(None, ge=0)
    """bibs/marc requests allowed per simulated hour (none: no limit)."""
    rate_limit_style: RateLimitStyle = "138"
    """Over the quota: Sierra's code 138 ("Try again in N minutes", HTTP 500) or a gateway's
    HTTP 429 with ``Retry-After`` seconds."""
    empty_export_file: bool = False
    """An empty export range yields a file with outputRecords 0 (BR1, 2018) instead of
    404/107 (BR2, 2019)."""
    export_omits_suppressed: bool = False
    """Suppressed bibs are left out of the export file too (an export setting some sites
    use); they still count in ``inputRecords``."""
    deleted_records_field: Literal["nonzero", "always", "never"] = "nonzero"
    """The export summary's ``deletedRecords``: only when some input bibs were deleted,
    always, or never (the reference marks it optional)."""
    file_origin: str | None = None
    """The summary's ``file`` URL names this origin (another loopback port, say) instead of
    the API's own; the file is still served here."""
    poison_json_fails: bool = False
    """``GET bibs`` naming a poison bib answers 500 too, not only its export block."""
    # -- the next request(s)
    fail_next: Failure | None = None
    """The next `count` API requests (those matching `path_prefix`) get an error."""
    empty_reply_next: Shot | None = None
    """The next `count` API requests get their connection closed with no response."""
    hang_next: float | None = None
    """The next API request gets no answer for this many (wall-clock) seconds, then a closed connection."""
    fail_export_next: ExportFailure | None = None
    """The next `count` export requests fail with `code`."""
    rate_limit_once: RateLimitOnce | None = None
    """One export request, a few from now, is rate limited."""

    @field_validator("file_origin")
    @classmethod
    def _no_trailing_slash(cls, value: str | None) -> str | None:
        return value.rstrip("/") if value else None


# The fault actions that predate POST /_control/faults (benchmarks, scripts and tests post
# them): action -> the faults its JSON body sets. They answer {"ok": true}.
FAULT_ACTIONS: dict[str, FaultAction] = {
    "fail_next": lambda f, d: {"fail_next": d},
    "empty_reply_next": lambda f, d: {"empty_reply_next": {"count": d.get("count", 1)}},
    "hang_next": lambda f, d: {"hang_next": d.get("seconds", 600)},
    "fail_export_next": lambda f, d: {"fail_export_next": d},
    "rate_limit_once": lambda f, d: {"rate_limit_once": d},
    "set_export_quota": lambda f, d: {"export_quota": d.get("quota")},
}
