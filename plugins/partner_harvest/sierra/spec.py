"""Sierra as the rest of the harvester sees it (protocols.ProtocolSpec): light, no HTTP stack."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BeforeValidator, Field, StrictInt, StrictStr, WithJsonSchema, field_validator

from partner_harvest.protocols import Channel, ConnectionType, OptionsKey, ProtocolSpec, StrictOptions
from partner_harvest.window import DAY, SECONDS

if TYPE_CHECKING:
    from partner_harvest.adapters import Adapter
    from partner_harvest.factory import Wiring
    from partner_harvest.readiness import Probe

DELETIONS = "deletions"  # the deletion poll's channel, on its own day cursor
BIBS: Literal["bibs"] = "bibs"
# The kinds of record a partner may mirror (options.sierra.channels): bibs always, items and
# holdings by choice, each with a change poll and a deletion poll of its own (channels below).
KINDS = (BIBS, "items", "holdings")
ITEM_FIELDS = ("id", "updatedDate", "createdDate", "deleted", "suppressed", "bibIds", "location", "status",
               "barcode", "callNumber", "itemType", "fixedFields", "varFields")
HOLDING_FIELDS = ("id", "updatedDate", "createdDate", "deleted", "suppressed", "bibIds", "itemIds", "location",
                  "fixedFields", "varFields")
ATTACHED_REQUIRED = ("id", "updatedDate", "bibIds")
RESERVED_EXPORT_PARAMS = ("id", "limit", "offset")  # the export keyset owns these
# One retry layer per failure kind: a 500 carries Sierra's error code (135 export failed, 138
# rate limited) that only the client can read, and a 429 names a wait the harvester weighs (a
# long one frees the worker slot), so the transport hands both over at once.
CLIENT_STATUSES = frozenset({500, 429})


class SierraOptions(StrictOptions):
    """options.sierra (Sierra only): keyword arguments of SierraClient, and suppressed bibs."""

    suppressed: Literal["keep", "flag", "purge"] = Field(default="purge", description=(
        "bibs, items and holdings suppressed in the catalogue (not public): purge (not held; one that "
        "becomes suppressed is deleted, reason suppressed), flag (held, carrying the warning "
        "sierra.suppressed) or keep (held as any)"))
    channels: tuple[Literal["bibs", "items", "holdings"], ...] = Field(default=(BIBS,), description=(
        "what the partner mirrors: bibs (always), items, holdings; items and holdings land in tables of "
        "their own (items, holdings), each kind with its own change poll and deletion poll on cursors of "
        "their own"))
    item_fields: tuple[StrictStr, ...] = Field(default=ITEM_FIELDS, description=(
        "the fields the items polls ask for (explicit, never the default set); must include "
        + ", ".join(ATTACHED_REQUIRED)))
    holding_fields: tuple[StrictStr, ...] = Field(default=HOLDING_FIELDS, description=(
        "the fields the holdings polls ask for; must include " + ", ".join(ATTACHED_REQUIRED)))

    @field_validator("channels")
    @classmethod
    def _bibs_and_once(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if BIBS not in value:
            raise ValueError("must include bibs (items and holdings belong to bibs)")
        if len(set(value)) != len(value):
            raise ValueError("names a kind twice")
        return value

    @field_validator("item_fields", "holding_fields")
    @classmethod
    def _required_fields(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        missing = [name for name in ATTACHED_REQUIRED if name not in value]
        if missing:
            raise ValueError(f"must include {', '.join(missing)}")
        return value

    refresh_margin: Annotated[float, Field(ge=0, strict=True, description=(
        "seconds before an access token's expiry at which a new one is fetched (tokens cannot be "
        "refreshed)"))] = 60.0
    server_error_tries: Annotated[StrictInt, Field(ge=1, description=(
        "tries of one request answered HTTP 500 (its body carries Sierra's error code, which the client "
        "reads); 502/503/504 and broken connections are retried by options.http.retries instead"))] = 3
    server_error_backoff: Annotated[float, Field(ge=0, strict=True, description=(
        "seconds before the second try of a 500, doubling after each (at most 60)"))] = 2.0


def _query_value(value: object) -> str | int:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise ValueError(f"must be a string or an integer, got {value!r}")
    return value


QueryValue = Annotated[str | int, BeforeValidator(_query_value),
                       WithJsonSchema({"anyOf": [{"type": "string"}, {"type": "integer"}]})]


class ExportOptions(StrictOptions):
    """options.export (Sierra only): the bibs/marc full-load export."""

    limit: Annotated[StrictInt, Field(ge=1)] | None = Field(default=None, description=(
        "ids per bibs/marc export block; default the partner's page_size; above 2000 (Sierra's cap) "
        "2000 is sent"))
    rate_limit_wait: Annotated[float, Field(ge=0, strict=True, description=(
        "seconds to wait on a rate limit (code 138, HTTP 429) that names no wait of its own"))] = 300.0
    max_rate_limit_waits: Annotated[StrictInt, Field(ge=0, description=(
        "rate-limit waits slept in one try at the same id before the try fails"))] = 12
    max_sleep_seconds: Annotated[float, Field(ge=0, strict=True, description=(
        "a rate-limit wait up to this long sleeps in the task; a longer one frees the worker slot "
        "(the task is rescheduled and resumes where it stopped)"))] = 30.0
    params: dict[StrictStr, QueryValue] = Field(
        default_factory=dict, description="extra query parameters of bibs/marc, passed through as given")

    @field_validator("params")
    @classmethod
    def _no_reserved(cls, value: dict[str, str | int]) -> dict[str, str | int]:
        clash = sorted(set(value) & set(RESERVED_EXPORT_PARAMS))
        if clash:
            raise ValueError(f"{', '.join(clash)} are set by the harvester, not by params")
        return value


def _attached_channels(kind: str, singular: str) -> tuple[Channel, Channel]:
    """A kind's change poll (to the second, on its own cursor) and its deletion poll (days)."""
    return (
        Channel(name=kind, task_id=f"poll_{kind}", granularity=SECONDS, entity=kind,
                summary=f"the changed {kind} (table {kind}), on their own cursor",
                doc=f"Sierra only (options.sierra.channels lists {kind}): the {kind} updated in their own window "
                    f"(keyset by id, explicit fields; without a cursor all of them, by id ranges) into the same "
                    f"staging; they land in the table {kind}. **Fails:** a 5xx after retries; clear it to poll again."),
        Channel(name=f"{singular}_deletions", task_id=f"poll_{singular}_deletions", granularity=DAY, entity=kind,
                summary=f"the deleted {kind}, on their own day cursor",
                doc=f"Sierra only: polls the deleted {kind} of the window's days (their own day cursor). "
                    "**Fails:** a 5xx after retries (never taken for an empty day); clear it to poll again."),
    )


ATTACHED_CHANNELS = (*_attached_channels("items", "item"), *_attached_channels("holdings", "holding"))


def chosen_channels(partner: Any) -> set[str]:
    """The partner's channels: the bibs' deletion poll, and each chosen kind's two polls."""
    return {DELETIONS} | {channel.name for channel in ATTACHED_CHANNELS
                          if channel.entity in partner.options.sierra.channels}


def build(wiring: Wiring) -> Adapter:
    from partner_harvest.sierra.client import SierraClient
    from partner_harvest.sierra.harvester import SierraAdapter

    partner, endpoint = wiring.partner, wiring.endpoint
    options: SierraOptions = partner.options.sierra
    client = SierraClient(partner.id, endpoint.base_url, wiring.session, endpoint.login or "", endpoint.password or "",
                          refresh_margin=options.refresh_margin, server_error_tries=options.server_error_tries,
                          server_error_backoff=options.server_error_backoff,
                          transport_retries=wiring.policy.retry_statuses)
    return SierraAdapter(partner, client)



def check(probe: Probe) -> None:
    from partner_harvest.sierra.readiness import check as probes

    probes(probe)

SPEC = ProtocolSpec(
    name="sierra",
    title="Sierra ILS",
    build=build,
    stack="partner_harvest.sierra.harvester",
    check=check,
    connection=ConnectionType(
        conn_type="sierra", hook_class="SierraHook", hook_name="Sierra ILS partner",
        doc="A Sierra ILS REST API: host = the API's base URL, login/password = client key/secret.",
        hidden_fields=("schema", "port"),
        relabeling={"host": "API base URL", "login": "Client key", "password": "Client secret"},
        placeholders={"host": "https://catalogue.example/iii/sierra-api (before /v6/...)",
                      "login": "the API client key (Sierra Admin App, API Keys)",
                      "password": "the client secret"},
    ),
    docs="docs/design/sierra.md",
    channels=(Channel(
        name=DELETIONS, task_id="poll_deletions", granularity=DAY,
        summary="the deleted bibs, on their own day cursor",
        doc="Sierra only: polls the deleted bibs of the window's days (its own day cursor) into the same staging. "
            "**Fails:** a 5xx after retries (never taken for an empty day); clear it to poll again.",
    ), *ATTACHED_CHANNELS),
    chosen_channels=chosen_channels,
    default_prefix="marc21",
    quiet_night=True,  # one look per poll: all empty, the night applies in freeze_window (airflow/quiet.py)
    options={
        "sierra": OptionsKey(SierraOptions, "Sierra only: the API client"),
        "export": OptionsKey(ExportOptions, "Sierra only: the full-load export"),
    },
    client_statuses=CLIENT_STATUSES,
    session_credentials=False,  # login and password are the API client's key and secret (client.py)
)
