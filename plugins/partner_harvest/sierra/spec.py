"""Sierra as the rest of the harvester sees it (protocols.ProtocolSpec): light, no HTTP stack."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import BeforeValidator, Field, StrictInt, StrictStr, WithJsonSchema, field_validator

from partner_harvest.protocols import Channel, ConnectionType, OptionsKey, ProtocolSpec, StrictOptions
from partner_harvest.window import DAY

if TYPE_CHECKING:
    from partner_harvest.adapters import Adapter
    from partner_harvest.factory import Wiring
    from partner_harvest.readiness import Probe

DELETIONS = "deletions"  # the deletion poll's channel, on its own day cursor
RESERVED_EXPORT_PARAMS = ("id", "limit", "offset")  # the export keyset owns these
# One retry layer per failure kind: a 500 carries Sierra's error code (135 export failed, 138
# rate limited) that only the client can read, and a 429 names a wait the harvester weighs (a
# long one frees the worker slot), so the transport hands both over at once.
CLIENT_STATUSES = frozenset({500, 429})


class SierraOptions(StrictOptions):
    """options.sierra (Sierra only): keyword arguments of SierraClient, and suppressed bibs."""

    suppressed: Literal["keep", "flag", "purge"] = Field(default="purge", description=(
        "bibs suppressed in the catalogue (not public): purge (not held; one that becomes suppressed is "
        "deleted, reason suppressed), flag (held, carrying the warning sierra.suppressed) or keep (held as "
        "any bib)"))

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
    ),),
    default_prefix="marc21",
    options={
        "sierra": OptionsKey(SierraOptions, "Sierra only: the API client"),
        "export": OptionsKey(ExportOptions, "Sierra only: the full-load export"),
    },
    client_statuses=CLIENT_STATUSES,
    session_credentials=False,  # login and password are the API client's key and secret (client.py)
)
