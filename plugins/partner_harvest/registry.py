"""The partner registry: which partners exist and how each is harvested.

Loaded from ``include/partners.yaml`` (or ``$HARVEST_PARTNERS_FILE``) at DAG-parse time and
validated with pydantic (``registry_schema`` publishes the same model as JSON Schema). One
bad entry must not take the other partners down: :func:`load_registry` returns the valid
partners and, separately, one :class:`RegistryError` per invalid entry, naming the file,
the partner and the field. Only a file that cannot be read at all fails as a whole.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import yaml
from croniter import CroniterError, croniter
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationError,
    ValidationInfo,
    WithJsonSchema,
    create_model,
    field_validator,
    model_validator,
)

from partner_harvest import protocols
from partner_harvest.durations import Duration, parse_duration  # noqa: F401 (parse_duration: the registry's reading, re-exported)
from partner_harvest.formats.checks import CHECKS, UnknownCheck, check_overrides
from partner_harvest.politeness import MAX_DELAY_MS, PolitenessOptions
from partner_harvest.schedule_spread import WINDOW_PATTERN, spread_schedule
from partner_harvest.transport import HttpPolicy
from partner_harvest.window import format_instant

PARTNERS_FILE_ENV = "HARVEST_PARTNERS_FILE"
DEFAULT_PARTNERS_FILE = Path(__file__).resolve().parents[2] / "include" / "partners.yaml"
SCHEMA_FILE = DEFAULT_PARTNERS_FILE.with_name("partners.schema.json")

# Words of lowercase letters and digits joined by single '_': never '__' (the separator of
# cursor keys, harvest_cursor__<id>__<channel>) and never a trailing '_'.
ID_PATTERN = r"^[a-z][a-z0-9]*(_[a-z0-9]+)*$"
ID_MAX_LENGTH = 63
_ID = re.compile(ID_PATTERN)
CURSOR_PREFIX = "harvest_cursor__"
DEFAULT_MAX_RECORD_BYTES = 8 * 1024 * 1024
# Caps a partner cannot pass, gentle: far above what real partners send.
DEFAULT_MAX_TOKEN_BYTES = 64 * 1024  # real tokens: tens to hundreds of bytes
DEFAULT_CHAIN_PAGES_SLACK = 3.0
DEFAULT_MAX_CHAIN_PAGES = 200_000  # 20 million records at 100 a page
DEFAULT_MAX_RUN_BYTES = 64 * 1024 ** 3
DEFAULT_RUN_DEADLINE = timedelta(hours=20)
FINISH_BY_PATTERN = r"^([01][0-9]|2[0-3]):[0-5][0-9]$"
MAX_RETRIES = 20


class RegistryError(ValueError):
    """The registry, or one entry of it, is unusable; the message names file, partner and field."""

    def __init__(self, path: Path | str, partner: str | None, field_name: str | None, problem: str):
        where = f"{path}"
        if partner:
            where += f": partner '{partner}'"
        if field_name:
            where += f", field '{field_name}'"
        super().__init__(f"{where}: {problem}")
        self.path = str(path)
        self.partner = partner
        self.field = field_name
        self.problem = problem


def cursor_key(partner_id: str, channel: str | None = None) -> str:
    """``harvest_cursor__<id>[__<channel>]``; ids and channels never contain ``__``,
    so no partner's key can equal another partner's channel key."""
    for part in (partner_id, channel):
        if part is not None and not _ID.match(part):
            raise ValueError(f"cursor key part {part!r} is not a slug without '__' (pattern {ID_PATTERN})")
    return CURSOR_PREFIX + partner_id + (f"__{channel}" if channel else "")


def cursor_value(until: datetime, granularity: str, run_id: str) -> dict[str, str]:
    """The cursor Variable's JSON value: the window's until, its granularity, who wrote it and when.
    Written by the cursor task, ``partner-harvest reset-cursor`` and benchmarks seeding history."""
    return {"until": format_instant(until), "granularity": granularity, "run_id": run_id,
            "updated_at": format_instant(datetime.now(timezone.utc))}


def finish_by_offset(schedule: str, finish_by: str) -> timedelta:
    """``finish_by`` as an offset from the run's cron tick. The schedule must fire at one
    time of day (single minute and hour fields), so the offset is the same for every run."""
    minute, hour = schedule.split()[:2]
    if not (minute.isdigit() and hour.isdigit()):
        raise ValueError(f"needs a schedule that runs at one time of day (minute and hour fields "
                         f"plain numbers), got {schedule!r}")
    due_h, due_m = (int(part) for part in finish_by.split(":"))
    offset = timedelta(hours=due_h - int(hour), minutes=due_m - int(minute)) % timedelta(days=1)
    if not offset:
        raise ValueError(f"{finish_by} is the schedule's own start time")
    return offset


# -- the model ---------------------------------------------------------------------------

def _cron(value: object) -> str:
    """Five fields, each in its range (croniter: ``61 * * * *`` never fires and is refused)."""
    if not isinstance(value, str) or len(value.split()) != 5:
        raise ValueError(f"must be a five-field cron expression, got {value!r}")
    try:
        croniter(value)
    except (CroniterError, ValueError) as exc:
        raise ValueError(f"is not a valid cron expression ({value!r}): {' '.join(str(exc).split())}") from None
    return value


def _field_list(value: Any) -> Any:
    if isinstance(value, str):
        return [f.strip() for f in value.split(",") if f.strip()]
    return value


Cron = Annotated[
    str,
    BeforeValidator(_cron),
    WithJsonSchema({"type": "string", "pattern": r"^\s*\S+(\s+\S+){4}\s*$",
                    "description": "five-field cron expression, UTC"}),
]
Fraction = Annotated[float, Field(ge=0, le=1, strict=True)]


def _protocol(value: str) -> str:
    if value not in protocols.names():
        raise ValueError(f"must be one of {', '.join(protocols.names())}")
    return value


# One of the protocols' names (protocols.specs()).
ProtocolName = Annotated[StrictStr, AfterValidator(_protocol),
                         WithJsonSchema({"type": "string", "enum": list(protocols.names())})]


class _Strict(BaseModel):
    """Unknown keys are errors everywhere: a typo must never be silently ignored (as in
    protocols.StrictOptions, the base of a protocol's own options)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class LimitsOptions(_Strict):
    """options.limits: what one partner may cost a worker and the database; each cap passed
    is a failure naming the partner, the cap and the request (records over
    max_record_bytes are quarantined instead)."""

    max_record_bytes: Annotated[StrictInt, Field(ge=1, description=(
        "bytes of one record's payload; a larger record is quarantined with the reason, not stored"))] = (
        DEFAULT_MAX_RECORD_BYTES)
    max_token_bytes: Annotated[StrictInt, Field(ge=64, description=(
        "an OAI-PMH resumptionToken longer than this (UTF-8 bytes) fails its chain"))] = DEFAULT_MAX_TOKEN_BYTES
    chain_pages_slack: Annotated[float, Field(ge=1, strict=True, description=(
        "an OAI-PMH chain may have at most this many times the pages its announced completeListSize "
        "justifies at its first page's size (plus the empty pages the loop guard allows)"))] = DEFAULT_CHAIN_PAGES_SLACK
    max_chain_pages: Annotated[StrictInt, Field(ge=1, description=(
        "pages of one OAI-PMH chain, whatever it announces (and when it announces no completeListSize)"))] = (
        DEFAULT_MAX_CHAIN_PAGES)
    max_run_bytes: Annotated[StrictInt, Field(ge=1, description=(
        "payload bytes one run may stage over all its channels and slices"))] = DEFAULT_MAX_RUN_BYTES


class CompletenessOptions(_Strict):
    """options.completeness (OAI-PMH): how a harvest proves it missed nothing."""

    list_identifiers: StrictBool = Field(default=False, description=(
        "after a harvest that announces no completeListSize, count the window with a separate "
        "ListIdentifiers stream (oai-list-identifiers) and compare"))


class ContentCheckOptions(_Strict):
    """options.content_check: the weekly reconcile's check of content behind unmoved datestamps."""

    mode: Literal["sample", "off"] = Field(default="sample", description=(
        "sample: each reconcile fetches a sample of held records by identifier and compares their content "
        "with what is held; records changed without a new datestamp mark the partner's datestamps unreliable "
        "and bring a content refresh (a full harvest) the next night; off: no sample"))
    share: Fraction = Field(default=0.01, description="the share of held records each check samples")
    floor: Annotated[StrictInt, Field(ge=1, description=(
        "at least this many records per check (all of a smaller partner): 200 find a 2 % share of silent "
        "changes with 98 % certainty in one check, 99.97 % in two"))] = 200
    cap: Annotated[StrictInt, Field(ge=1, description="at most this many records per check")] = 2000
    refresh_every: Annotated[StrictInt, Field(ge=1)] | None = Field(default=None, description=(
        "a content refresh every n-th reconcile whatever the checks find (e.g. 4: about monthly); "
        "unset: only when a check finds silent changes"))


def _validation_overrides(value: object) -> object:
    if isinstance(value, dict):
        try:
            check_overrides(value)
        except UnknownCheck as exc:
            raise ValueError(str(exc)) from None
    return value


ValidationOverrides = Annotated[
    dict[StrictStr, Literal["reject", "warn"]],
    BeforeValidator(_validation_overrides),
    WithJsonSchema({
        "type": "object",
        "propertyNames": {"enum": sorted(name for name, check in CHECKS.items() if check.overridable)},
        "additionalProperties": {"enum": ["reject", "warn"]},
        "description": "validation checks turned into a reject or a warning for this partner "
                       "(docs/operator/validation.md), e.g. {marc.no_001: reject}",
    }),
]
class CommonOptions(_Strict):
    """options: per-partner settings, each typed; an unknown key anywhere is an error naming it.
    The keys of a protocol's own (``options.sierra``, ``options.oai``...) are its spec's
    (protocols.ProtocolSpec.options): :data:`Options` adds them."""

    http: HttpPolicy = Field(default_factory=HttpPolicy, description=(
        "the HTTP transport: timeouts, retries, caps on responses (every key optional)"))
    limits: LimitsOptions = Field(default_factory=LimitsOptions, description=(
        "what one partner may cost a worker and the database"))
    completeness: CompletenessOptions = Field(default_factory=CompletenessOptions, description=(
        "OAI-PMH: the completeness proof of a harvest"))
    content_check: ContentCheckOptions = Field(default_factory=ContentCheckOptions, description=(
        "the weekly reconcile's content check: a sample fetched by identifier, compared by content"))
    validation: ValidationOverrides = Field(default_factory=dict)
    politeness: PolitenessOptions = Field(default_factory=PolitenessOptions, description=(
        "the adaptive back-off at the partner's endpoint host, shared with every partner on that host"))

    if TYPE_CHECKING:
        def __getattr__(self, name: str) -> Any:
            """A protocol's own options (typed where its package reads them)."""


if TYPE_CHECKING:
    Options = CommonOptions
else:
    Options = create_model(
        "Options", __base__=CommonOptions, __doc__=CommonOptions.__doc__,
        **{key: (option.model, Field(default_factory=option.model, description=option.description))
           for spec in protocols.specs() for key, option in spec.options.items()})


class SliceSettings(_Strict):
    """slicing: when a run is harvested as slices (mapped tasks), and how finely.

    A full harvest, or a window longer than ``long_window``, whose expected size (OAI
    ``completeListSize``; Sierra the span of bib ids; IIIF the stream's ``totalItems``) is
    above ``threshold_records`` is cut into slices of about ``target_records``, at most
    ``max_slices`` (IIIF: ranges of the page chain, full harvests only). A Sierra change poll has
    no count: a window longer than ``long_window`` is cut into pieces of that length. ``sets``
    (OAI-PMH) cut by set first, when their counts add up at planning time
    (oai/slicing.plan_by_sets); otherwise by datestamp.
    """

    threshold_records: Annotated[StrictInt, Field(ge=1, description=(
        "a full harvest (or a window longer than long_window) expected to hold more records than this "
        "is harvested as slices"))] = 200_000
    target_records: Annotated[StrictInt, Field(ge=1, description=(
        "about this many records per slice (with several lanes the plan cuts up to 8 times finer, "
        "then joins neighbours into slices of falling size)"))] = 100_000
    max_slices: Annotated[StrictInt, Field(ge=1, le=256, description=(
        "at most this many slices of this size; the lanes (harvest_changes instances) are min(max_slices, "
        "pool_slots); 1 turns slicing off"))] = 8
    long_window: Duration = Field(default=timedelta(days=30), description=(
        "an incremental or requested window longer than this is considered for slicing; a Sierra change "
        "poll (no count) is cut into pieces of this length"))
    without_count: Annotated[StrictInt, Field(ge=1, le=256, description=(
        "OAI-PMH full harvest of a repository that announces no completeListSize: this many equal time "
        "ranges; IIIF full harvest of a stream that announces no totalItems: this many page ranges "
        "(1: no slicing)"))] = 1
    reconcile_slices: Annotated[StrictInt, Field(ge=1, le=256, description=(
        "the reconcile's sweep as this many slices (OAI-PMH datestamp ranges, Sierra bib id ranges), each "
        "retried on its own, when the partner holds more than threshold_records; min(reconcile_slices, pool_slots) "
        "lanes (sweep_ids instances) sweep them, biggest first (with several lanes a big partner is cut up to 8 "
        "times finer, then neighbours joined into slices of falling size); 1: the reconcile stays one task"))] = 1
    sets: tuple[Annotated[str, Field(min_length=1, pattern=r"^\S+$", strict=True)], ...] = Field(
        default=(), description=(
            "OAI-PMH: setSpecs that partition the repository (every record, deleted ones too, in exactly "
            "one of them): a big window is harvested one slice per set (a set above target_records cut in "
            "time), when the sets' counts add up to the whole list's at planning time (else by datestamp); "
            "2..max_slices sets; needs no partner set"))

    @model_validator(mode="after")
    def _target_below_threshold(self) -> SliceSettings:
        if self.target_records > self.threshold_records:
            raise ValueError("target_records must not exceed threshold_records")
        if self.long_window < timedelta(hours=1):
            raise ValueError("long_window must be at least 1h")
        if self.sets:
            if len(set(self.sets)) != len(self.sets):
                raise ValueError("sets: a set is listed twice")
            if not 2 <= len(self.sets) <= self.max_slices:
                raise ValueError(f"sets: list 2 to max_slices ({self.max_slices}) sets, one slice each; "
                                 f"{len(self.sets)} given")
        return self



_Text = Annotated[str, Field(min_length=1, pattern=r"\S", strict=True)]
SetSpec = Annotated[str, Field(min_length=1, pattern=r"^\S+$", strict=True)]


def _with_sets() -> str:
    """The protocols whose spec says partners select sets (``ProtocolSpec.sets``)."""
    return ", ".join(spec.name for spec in protocols.specs() if spec.sets)


# The shortest value a duration field takes (and how its error shows it).
_DURATION_FLOORS = {"run_deadline": (timedelta(minutes=1), "1m"), "approval_timeout": (timedelta(seconds=1), "1s")}


class Partner(_Strict):
    """One partner repository and the knobs its DAGs are built from: one entry of ``partners:``.

    This model is the runtime object too: what the file says, validated once, with every
    default and rule here. Python code builds one from a registry-shaped mapping
    (``Partner(**entry)`` or ``Partner.model_validate(entry)``); the attribute of the file's
    ``set`` is ``set_spec`` (either name is accepted).
    """

    model_config = ConfigDict(validate_by_name=True, validate_by_alias=True)

    id: Annotated[str, Field(pattern=ID_PATTERN, max_length=ID_MAX_LENGTH, strict=True, description=(
        "slug: lowercase letters and digits in words joined by single '_'; DAGs harvest_<id> and "
        "reconcile_<id>, pool partner_<id>, cursor harvest_cursor__<id>"))]
    protocol: ProtocolName = Field(description=f"one of {', '.join(protocols.names())}")
    conn_id: Annotated[str, Field(min_length=1, pattern=r"\S", strict=True, description=(
        "Airflow Connection whose host is the endpoint's base URL (Sierra: login the client key, "
        "password the client secret)"))]
    schedule: Cron = Field(default="0 2 * * *", description=(
        "when the harvest runs (cron, UTC); with schedule_window and no schedule, a time in the window"))
    schedule_window: Annotated[str, Field(pattern=WINDOW_PATTERN, strict=True)] | None = Field(
        default=None, description=(
            "HH:MM-HH:MM (UTC), e.g. 02:00-05:00: the nightly harvest starts at a minute in this window "
            "picked from the partner's id (the same minute every parse, partners spread evenly); "
            "excludes schedule"))
    request_delay: Annotated[StrictInt, Field(ge=0, le=MAX_DELAY_MS, description=(
        "milliseconds between the starts of two requests to the partner's endpoint host, kept by every "
        "slice, task and partner on that host together (0: no delay; the adaptive back-off of "
        "options.politeness still applies)"))] = 0
    lag: Duration = Field(default=timedelta(minutes=10), description=(
        "overlap of windows: the next window starts at the previous until minus this"))
    metadata_prefix: _Text = Field(default=None, validate_default=True, description=(
        "a prefix, or auto (OAI-PMH: LIDO when advertised, else oai_dc); default the protocol's: "
        + ", ".join(f"{spec.default_prefix} ({spec.title})" for spec in protocols.specs())))
    set_spec: _Text | None = Field(default=None, alias="set", description=(
        "OAI-PMH: harvest this set only (sets with one set)"))
    sets: tuple[SetSpec, ...] = Field(default=(), description=(
        "OAI-PMH: harvest the union of these sets (one list each; a record in several is one record); "
        "a record that leaves them is deleted here"))
    exclude_sets: tuple[SetSpec, ...] = Field(default=(), description=(
        "OAI-PMH: records in any of these sets, or in a set below one (a:b is below a), are not held; "
        "one that moves into one is deleted here"))
    description: StrictStr = Field(default="", description="free text shown with the partner's DAGs")
    max_token_restarts: Annotated[StrictInt, Field(ge=0, le=100, description=(
        "OAI-PMH: restarts of a run's chain from its frozen bounds after badResumptionToken"))] = 3
    page_size: Annotated[StrictInt, Field(ge=1, le=2000, description=(
        "Sierra: records per page of the change and deletion polls (Sierra's cap is 2000)"))] = 2000
    fields: Annotated[tuple[StrictStr, ...], BeforeValidator(_field_list)] = Field(default=(), description=(
        "Sierra: the bib fields the change poll asks for (a list or a comma-separated string); "
        "empty: the harvester's own set"))
    deletion_overlap_days: Annotated[StrictInt, Field(ge=0, le=365, description=(
        "Sierra: the deletion poll starts this many days before its cursor"))] = 1
    pool_slots: Annotated[StrictInt, Field(ge=1, le=64, description=(
        "concurrent requests to this endpoint: the slots of pool partner_<id>"))] = 1
    retries: Annotated[StrictInt, Field(ge=0, le=MAX_RETRIES)] = Field(
        default=3, description="Airflow retries of each task (0..20), exponential backoff from retry_delay")
    reconcile_schedule: Cron = Field(default="0 4 * * 0", description="when the full reconcile runs (cron, UTC)")
    max_purge_fraction: Fraction = Field(default=0.05, description=(
        "a reconcile that would remove more than this share of the partner's records applies nothing "
        "until a person approves it at its approval gate (scripts: allow_mass_purge)"))
    max_shrink_fraction: Fraction = Field(default=0.25, description=(
        "a harvest that would shrink the partner's live set by more than this share (records its "
        "tombstones purge, plus, for a full harvest, held records it did not return) waits for a "
        "person's approval before its apply (docs/operator/approvals.md)"))
    approval_timeout: Duration = Field(default=timedelta(days=2), description=(
        "how long a run waiting at its approval gate (shrink or purge limit) waits for an answer "
        "before the alert; at least 1s"))
    approval_timeout_action: Literal["wait", "abandon"] = Field(default="wait", description=(
        "after approval_timeout without an answer: wait (alert, keep waiting) or abandon "
        "(alert, reject the run: staging dropped, cursor untouched)"))
    quarantine_alert_rate: Fraction = Field(default=0.05, description=(
        "alert when a run quarantines more than this share of the records it fetched"))
    purge_alert_fraction: Fraction = Field(default=0.05, description=(
        "alert when one run purges more than this share of the partner's records"))
    quiet_period: Duration = Field(default=timedelta(days=7), description=(
        "alert when nothing was fetched from the partner for longer than this"))
    run_deadline: Duration = Field(
        default=DEFAULT_RUN_DEADLINE,
        description="alert when a run has not finished this long after its logical date (a nightly "
        "run's cron tick): a missing pool, a stuck task; at least 1m")
    finish_by: Annotated[str, Field(pattern=FINISH_BY_PATTERN, strict=True)] | None = Field(
        default=None,
        description="HH:MM (UTC): alert when a scheduled run has not finished by then, counted from "
        "its start time (schedule 0 2 * * *, finish_by 06:00: four hours); needs a schedule that runs "
        "at one time of day")
    history_retention: Duration = Field(default=timedelta(days=30), description=(
        "how long versions a change replaced or purged are kept (record_history): how far back "
        "partner-harvest rollback and records_as_of reach"))
    options: Options = Field(default_factory=Options, description="per-partner settings by subject")
    # -- Airflow task arguments; unset: the DAG factory's defaults
    execution_timeout: Duration | None = Field(
        default=None, description="a task attempt running longer fails (and is retried); default 6h")
    retry_delay: Duration | None = Field(
        default=None, description="wait before a task's first retry, doubling after each; default 2m")
    max_retry_delay: Duration | None = Field(
        default=None, description="the longest wait between two retries; default 30m")
    slicing: SliceSettings = Field(default_factory=SliceSettings, description=(
        "when a big run is harvested as slices (mapped tasks), and how finely"))

    @model_validator(mode="before")
    @classmethod
    def _spread_schedule(cls, data: Any) -> Any:
        """``schedule_window`` becomes the partner's schedule: a minute of the window picked by id."""
        if not isinstance(data, dict) or data.get("schedule_window") is None:
            return data
        window, pid = data["schedule_window"], data.get("id")
        if not (isinstance(window, str) and isinstance(pid, str)):
            return data  # the fields' own checks name what is wrong
        try:
            spread = spread_schedule(pid, window)
        except ValueError as exc:
            raise ValueError(f"schedule_window: {exc}") from None
        if data.get("schedule") not in (None, spread):  # the spread one itself: a copy (evolve, a dump)
            raise ValueError("give schedule or schedule_window, not both")
        return {**data, "schedule": spread}

    @field_validator("conn_id")
    @classmethod
    def _stripped(cls, value: str) -> str:
        return value.strip()

    @field_validator("metadata_prefix", mode="before")
    @classmethod
    def _default_prefix(cls, value: object, info: ValidationInfo) -> object:
        """The default is the protocol's (ProtocolSpec.default_prefix): auto for most, marc21 for Sierra."""
        if value is None:  # an unknown protocol fails on its own: nothing to add here
            protocol = info.data.get("protocol")
            return protocols.spec_of(protocol).default_prefix if protocol is not None else "auto"
        return value

    @field_validator("metadata_prefix")
    @classmethod
    def _prefix(cls, value: str) -> str:
        return value.strip()

    @field_validator("execution_timeout", "retry_delay", "max_retry_delay")
    @classmethod
    def _positive(cls, value: timedelta | None) -> timedelta | None:
        if value is not None and value <= timedelta(0):
            raise ValueError("must be a positive duration (e.g. 30s, 10m, 2h)")
        return value

    @field_validator("max_retry_delay")
    @classmethod
    def _not_below_retry_delay(cls, value: timedelta | None, info: ValidationInfo) -> timedelta | None:
        delay = info.data.get("retry_delay")
        if value is not None and delay is not None and value < delay:
            raise ValueError(f"is shorter than retry_delay ({int(delay.total_seconds())}s), the first wait")
        return value

    @model_validator(mode="after")
    def _slicing_sets_fit_the_partner(self) -> Partner:
        if self.slicing.sets:
            if not protocols.spec_of(self.protocol).sets:
                raise ValueError(f"slicing.sets applies to protocol {_with_sets()} only")
            if self.set_spec is not None or self.sets:
                raise ValueError("slicing.sets partitions the whole repository: it cannot be combined with set "
                                 "or sets")
        return self

    @model_validator(mode="after")
    def _set_selection(self) -> Partner:
        """``set`` is ``sets`` of one; an exclusion must leave something of every listed set."""
        if (self.sets or self.exclude_sets) and not protocols.spec_of(self.protocol).sets:
            raise ValueError(f"sets and exclude_sets apply to protocol {_with_sets()} only")
        if self.set_spec is not None and self.sets:
            raise ValueError("give set (one set) or sets, not both")
        for name in ("sets", "exclude_sets"):
            listed = getattr(self, name)
            if len(set(listed)) != len(listed):
                raise ValueError(f"{name}: a set is listed twice")
        for spec in self.selected_sets:
            for excluded in self.exclude_sets:
                if spec == excluded or spec.startswith(excluded + ":"):
                    raise ValueError(f"exclude_sets: {excluded} excludes all of the listed set {spec}")
        return self

    @property
    def selected_sets(self) -> tuple[str, ...]:
        """The sets harvested (their union): ``sets``, or ``set``; () for the whole repository."""
        return self.sets or ((self.set_spec,) if self.set_spec else ())

    @model_validator(mode="after")
    def _finish_by_fits_the_schedule(self) -> Partner:
        if self.finish_by is not None:
            try:
                finish_by_offset(self.schedule, self.finish_by)
            except ValueError as exc:
                raise ValueError(f"finish_by: {exc}") from None
        return self

    @field_validator("run_deadline", "approval_timeout")
    @classmethod
    def _duration_floor(cls, value: timedelta, info: ValidationInfo) -> timedelta:
        floor, shown = _DURATION_FLOORS[info.field_name or ""]
        if value < floor:
            raise ValueError(f"must be at least {shown}")
        return value

    @field_validator("options")
    @classmethod
    def _protocol_options(cls, value: Options, info: ValidationInfo) -> Options:
        """A protocol's own options (its spec's) are refused for a partner of another protocol."""
        protocol = info.data.get("protocol")
        if protocol is not None:
            for spec in protocols.specs():
                for name in spec.options:
                    if spec.name != protocol and name in value.model_fields_set:
                        raise ValueError(f"options.{name} applies to protocol {spec.name} only")
        return value

    @property
    def finish_by_offset(self) -> timedelta | None:
        """From the scheduled run's logical date (its cron tick) to ``finish_by``: under a day."""
        if not self.finish_by:
            return None
        return finish_by_offset(self.schedule, self.finish_by)

    @property
    def dag_id(self) -> str:
        return f"harvest_{self.id}"

    @property
    def cursor_key(self) -> str:
        return cursor_key(self.id)

    @property
    def reconcile_dag_id(self) -> str:
        return f"reconcile_{self.id}"

    @property
    def pool(self) -> str:
        """The Airflow pool that bounds concurrent requests to this partner's endpoint."""
        return f"partner_{self.id}"

    def evolve(self, **changes: object) -> Partner:
        """A copy with ``changes`` (registry keys or attribute names), validated again."""
        current = {name: getattr(self, name) for name in type(self).model_fields}
        return type(self).model_validate({**current, **changes})


class RegistryFile(_Strict):
    """The whole file: ``partners:``, a list of partner entries."""

    model_config = ConfigDict(extra="forbid", title="partner harvest registry")
    partners: list[Partner] = Field(description="one entry per partner repository; ids unique")


def registry_schema() -> dict[str, Any]:
    """The JSON Schema of the registry file (committed as include/partners.schema.json)."""
    schema = RegistryFile.model_json_schema()
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema}


# -- loading -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Registry:
    """The valid partners, and one error per invalid entry (which builds nothing)."""

    path: Path
    partners: list[Partner]
    errors: list[RegistryError]

    def error_for(self, partner_id: str) -> RegistryError | None:
        return next((e for e in self.errors if e.partner == partner_id), None)


def partners_file() -> Path:
    """``$HARVEST_PARTNERS_FILE``; else the repository's include/partners.yaml when the
    package runs from its source tree (plugins/ or an editable install); else, installed
    into site-packages, ``$AIRFLOW_HOME/include/partners.yaml`` (the layout of this repo)."""
    given = os.environ.get(PARTNERS_FILE_ENV)
    if given:
        return Path(given)
    if DEFAULT_PARTNERS_FILE.is_file():
        return DEFAULT_PARTNERS_FILE
    airflow_home = Path(os.environ.get("AIRFLOW_HOME") or "~/airflow").expanduser()
    return airflow_home / "include" / "partners.yaml"


# One parse per process and file content: a DAG-file parse, then get_partner() in the same task
# process, read it once. Keyed by the bytes' hash: an edit is seen at once, whatever
# the file system's mtime granularity. The cached objects are shared: treat them as read-only.
_LOADED: dict[Path, tuple[str, Registry]] = {}
_RAW: dict[Path, tuple[str, object]] = {}
LOADS = {"yaml": 0}  # how many times a registry file was parsed (tests count them)


def _read(path: Path) -> tuple[str, bytes]:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise RegistryError(path, None, None, "file not found") from None
    return hashlib.sha256(data).hexdigest(), data


def _raw(path: Path) -> tuple[str, object]:
    """The file's YAML, parsed once per content (libyaml when present: 5-10x faster)."""
    digest, data = _read(path)
    cached = _RAW.get(path)
    if cached and cached[0] == digest:
        return cached
    LOADS["yaml"] += 1
    try:
        raw = yaml.load(data, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # noqa: S506 (a safe loader)
    except yaml.YAMLError:
        try:  # the pure-Python loader's message names line and column the way the docs show
            yaml.safe_load(data)
        except yaml.YAMLError as exc:
            raise RegistryError(path, None, None, f"not valid YAML: {exc}") from None
        raise
    _RAW.clear()  # one file's contents at a time per path is all a process needs
    _RAW[path] = (digest, raw)
    return digest, raw


def load_registry(path: Path | str | None = None) -> Registry:
    """Read the file; validate each entry on its own. Raises only when the file as a whole
    is unusable (missing, not YAML, no ``partners:`` list). Cached per file content."""
    path = Path(path) if path else partners_file()
    digest, raw = _raw(path)
    cached = _LOADED.get(path)
    if cached and cached[0] == digest:
        return cached[1]
    registry = parse_registry(raw, path)
    if len(_LOADED) > 8:  # a test session reads many files; a deployment one
        _LOADED.clear()
    _LOADED[path] = (digest, registry)
    return registry


def parse_registry(raw: object, path: Path | str = "<registry>") -> Registry:
    """A registry-shaped value (``{"partners": [...]}``, as the YAML file parses) checked the
    way :func:`load_registry` checks the file: each entry on its own; ``path`` names it in errors."""
    path = Path(path)
    if not isinstance(raw, dict) or not isinstance(raw.get("partners"), list):
        raise RegistryError(path, None, "partners", "expected a top-level 'partners:' list")
    unknown = sorted(str(k) for k in raw if k != "partners")
    if unknown:
        raise RegistryError(path, None, unknown[0], "unknown top-level key (only 'partners:' is allowed)")
    entries: list[tuple[str, Partner | RegistryError]] = []
    for index, entry in enumerate(raw["partners"]):
        label = _label(entry, index)
        try:
            entries.append((label, Partner.model_validate(entry)))
        except ValidationError as exc:
            entries.append((label, _entry_error(path, label, exc)))
    counts: dict[str, int] = {}
    for label, _ in entries:
        counts[label] = counts.get(label, 0) + 1
    partners: list[Partner] = []
    errors: list[RegistryError] = []
    for label, result in entries:
        if counts[label] > 1:
            # Which of the two is meant is unknowable: neither runs, both are reported.
            error = RegistryError(path, label, "id", f"duplicate partner id ({counts[label]} entries)")
            if error.partner not in {e.partner for e in errors}:
                errors.append(error)
        elif isinstance(result, RegistryError):
            errors.append(result)
        else:
            partners.append(result)
    return Registry(path, sorted(partners, key=lambda p: p.id), errors)


def load_partners(path: Path | str | None = None) -> list[Partner]:
    """Every partner, sorted by id; raises the first entry's error if any entry is invalid
    (for tools that must see the whole registry; the DAG files use :func:`load_registry`)."""
    registry = load_registry(path)
    if registry.errors:
        raise registry.errors[0]
    return registry.partners


def get_partner(partner_id: str, path: Path | str | None = None) -> Partner:
    """One partner; another partner's bad entry does not matter here. Validates only that
    entry (a task process needs one partner, not the thousands of a big registry)."""
    path = Path(path) if path else partners_file()
    digest, raw = _raw(path)
    cached = _LOADED.get(path)
    registry = cached[1] if cached and cached[0] == digest else None
    if registry is None and isinstance(raw, dict) and isinstance(raw.get("partners"), list) \
            and not any(k != "partners" for k in raw):
        entries = raw["partners"]
        mine = [e for i, e in enumerate(entries) if _label(e, i) == partner_id]
        if len(mine) == 1:
            key = (path, digest, partner_id)
            if key not in _ONE:
                _ONE.clear()
                _ONE[key] = parse_registry({"partners": mine}, path)
            registry = _ONE[key]
    if registry is None:
        registry = load_registry(path)
    for partner in registry.partners:
        if partner.id == partner_id:
            return partner
    error = registry.error_for(partner_id)
    if error is not None:
        raise error
    raise RegistryError(registry.path, partner_id, "id", "no such partner in the registry")


_ONE: dict[tuple[Path, str, str], Registry] = {}


def _label(entry: Any, index: int) -> str:
    """How errors name an entry: its id when it has a readable one, else its position."""
    pid = entry.get("id") if isinstance(entry, dict) else None
    if isinstance(pid, str) and pid.strip() and len(pid) <= 100 and pid.isprintable():
        return pid.strip()
    return f"#{index + 1}"


def _entry_error(path: Path, label: str, exc: ValidationError) -> RegistryError:
    problems = []
    for err in exc.errors(include_url=False, include_input=False):
        loc = ".".join(str(part) for part in err["loc"])
        problems.append((loc or None, _describe(err)))
    field_name, problem = problems[0]
    if field_name is None:
        problem = "each partner must be a mapping" if "dict" in problem or "mapping" in problem else problem
    more = "; ".join(f"field '{loc}': {text}" for loc, text in problems[1:])
    return RegistryError(path, label, field_name, problem + (f" (also {more})" if more else ""))


def _describe(err: Any) -> str:
    kind = err["type"]
    if kind == "extra_forbidden":
        allowed = _allowed_keys(err["loc"][:-1])
        return f"unknown field (known: {', '.join(allowed)})" if allowed else "unknown field"
    if kind == "missing":
        return "required"
    if kind == "model_type":
        return "must be a mapping"
    message = str(err["msg"])
    message = message.removeprefix("Value error, ")
    if kind == "string_pattern_mismatch" and err["loc"] == ("id",):
        message = ("must be a slug: lowercase letters and digits in words joined by single '_', starting with a "
                   "letter (no '__', no trailing '_')")
    return message


def _allowed_keys(loc: tuple[Any, ...]) -> list[str]:
    """The keys the model allows at ``loc`` (a path of field names)."""
    model: Any = Partner
    for part in loc:
        info = getattr(model, "model_fields", {}).get(part)
        if info is None:
            return []
        model = info.annotation
    fields = getattr(model, "model_fields", None)
    if not fields:
        return []
    return sorted(info.alias or name for name, info in fields.items())


def schema_text() -> str:
    import json

    return json.dumps(registry_schema(), indent=2) + "\n"
