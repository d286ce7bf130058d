"""File deliveries as the rest of the harvester sees them (protocols.ProtocolSpec): light."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import Field, StrictStr, model_validator

from partner_harvest.durations import Duration
from partner_harvest.protocols import ConnectionType, OptionsKey, ProtocolSpec, StrictOptions

if TYPE_CHECKING:
    from partner_harvest.adapters import Adapter
    from partner_harvest.factory import Wiring
    from partner_harvest.readiness import Probe

PATTERN_HELP = ("relative to the location; {date:FORMAT} is the delivery's date in strftime codes (%Y %m %d %H %M "
                "%S %j %y %b), * any characters within a path segment")
Pattern = Annotated[str, Field(min_length=1, pattern=r"\{date:[^}]+\}", strict=True)]


class FormatOptions(StrictOptions):
    """options.files.format: how one file holds its records, and where each record names itself."""

    kind: Literal["csv", "tsv", "jsonl", "xml", "marc"] = Field(description=(
        "csv or tsv (a header row, one record a row), jsonl (one JSON object a line), xml (a record element "
        "repeated in one document, e.g. a LIDO or MARCXML collection), marc (MARC 21 binary, ISO 2709)"))
    identifier: StrictStr | None = Field(default=None, description=(
        "where a record names itself: a column (csv, tsv), a dotted path (jsonl: a.b.0), a path below the "
        "record element (xml: lido:lidoRecID, or @id), a tag or tag$code (marc; default 001)"))
    deleted: StrictStr | None = Field(default=None, description=(
        "a column, path or element whose value marks a deletion (one of deleted_values); marc: leader/05 d "
        "always marks one"))
    deleted_values: tuple[StrictStr, ...] = Field(default=("true", "1", "yes", "deleted", "d"), description=(
        "values of the deleted marker that mean deleted (compared without case and surrounding blanks)"))
    title: StrictStr | None = Field(default=None, description=(
        "the title's column or path (csv, tsv, jsonl); xml and marc records take the title their format finds"))
    datestamp: StrictStr | None = Field(default=None, description=(
        "the record's own modification time (column or path, ISO 8601 or YYYY-MM-DD); without it every item "
        "of a delivery carries the delivery's date, which orders deliveries as published (the safe default: "
        "give it only when the partner's stamps agree across deliveries, deletions included)"))
    record: StrictStr | None = Field(default=None, description=(
        "xml: the record element, {namespace}local or prefix:local with namespaces (e.g. lido:lido)"))
    namespaces: dict[StrictStr, StrictStr] = Field(default_factory=dict, description=(
        "xml: prefixes the record and identifier paths use, e.g. {lido: http://www.lido-schema.org}"))
    delimiter: Annotated[str, Field(min_length=1, max_length=1, strict=True)] | None = Field(default=None, description=(
        "csv: the field separator (default , for csv, a tab for tsv)"))
    encoding: StrictStr = Field(default="utf-8", description="the text encoding of csv, tsv and jsonl files")
    compression: Literal["auto", "none", "gzip", "zip"] = Field(default="auto", description=(
        "auto: by the file's name (.gz, .zip); zip: every member in name order"))

    @model_validator(mode="after")
    def _needs_identifier(self) -> FormatOptions:
        if self.identifier is None and self.kind != "marc":
            raise ValueError(f"identifier: required for kind {self.kind} (the column or path naming each record)")
        if self.kind == "xml" and self.record is None:
            raise ValueError("record: required for kind xml (the repeated record element)")
        return self


class FilesOptions(StrictOptions):
    """options.files (file-delivery only): where the deliveries are, how they are dated and when one is complete."""

    full: Pattern | None = Field(default=None, description=(
        "the files of a full dump (everything the partner holds), e.g. {date:%Y%m%d}/objects.csv.gz; "
        + PATTERN_HELP))
    delta: Pattern | None = Field(default=None, description=(
        "the files of a delta (changes and deletions since the delivery before), e.g. hub-{date:%Y-%m-%d}.jsonl"))
    done_marker: Pattern | None = Field(default=None, description=(
        "a file whose presence says the delivery of its date is complete, e.g. {date:%Y%m%d}/_SUCCESS"))
    checksums: Pattern | None = Field(default=None, description=(
        "a checksum file per delivery (sha256sum or md5sum lines: hex, blanks, file name): a delivery is "
        "complete when it lists each of its files; each file is verified as it is read"))
    manifest: Pattern | None = Field(default=None, description=(
        "a ResourceSync resource list or change list per delivery: its files are those it lists, complete "
        "when each is present at its listed length; md5 or sha-256 hashes are verified as read"))
    every: Duration | None = Field(default=None, description=(
        "how often deltas come (e.g. 1d): a delta more than this after the delivery before it leaves a gap, "
        "and the chain waits there for the missing delta or the next full dump; unset: no gap is detected"))
    settle: Duration = Field(default=timedelta(0), description=(
        "without done_marker, checksums or manifest: a delivery counts as complete when none of its files was "
        "modified for this long (e.g. 10m)"))
    max_deliveries: Annotated[int, Field(ge=1, le=100_000, strict=True, description=(
        "dated files one listing may hold; more fails the run naming the cap"))] = 10_000
    format: FormatOptions | None = Field(default=None, description="how the files hold records (required)")

    @model_validator(mode="after")
    def _complete(self) -> FilesOptions:
        """A partner's own options name their patterns and format (the default, built for
        partners of other protocols, stays empty)."""
        if self.model_fields_set and self.full is None and self.delta is None:
            raise ValueError("give full, delta or both: the patterns of the partner's dated files")
        if self.model_fields_set and self.format is None:
            raise ValueError("format: required (kind and identifier of the records)")
        return self


def build(wiring: Wiring) -> Adapter:
    from partner_harvest.files.harvester import FileDeliveryAdapter
    from partner_harvest.files.storage import Storage

    return FileDeliveryAdapter(wiring.partner, Storage.for_endpoint(wiring.partner.id, wiring.endpoint))


def check(probe: Probe) -> None:
    from partner_harvest.files.readiness import check as probes

    probes(probe)


SPEC = ProtocolSpec(
    name="file-delivery",
    title="File deliveries",
    build=build,
    stack="partner_harvest.files.harvester",
    check=check,
    connection=ConnectionType(
        conn_type="file_delivery", hook_class="FileDeliveryHook", hook_name="File-delivery partner",
        doc=("Dated dumps and deltas: host = the location's URL (s3://bucket/prefix, https://host/dumps/, "
             "file:///srv/partner); login/password = the store's key and secret (S3) or Basic credentials "
             "(HTTP); extra endpoint_url (an S3-compatible store), region_name."),
        hidden_fields=("schema", "port"),
        relabeling={"host": "Location URL", "login": "Access key or user", "password": "Secret or password"},
        placeholders={"host": "s3://bucket/exports/ or https://museum.example/opendata/ or file:///srv/dumps"},
        object_storage=True,
        fields={"endpoint_url": ("Endpoint URL", "An S3-compatible store's URL (MinIO, Ceph, a cloud's S3 API), e.g. "
                                 "https://s3.example.org. Empty: AWS itself."),
                "region_name": ("Region", "The bucket's region, e.g. eu-west-1. Empty: the store's default.")},
    ),
    docs="docs/design/files.md",
    default_prefix="auto",
    options={"files": OptionsKey(FilesOptions, "file-delivery only: patterns, completeness, format")},
    session_credentials=False,
    schemes=("s3", "https", "http", "file"),
)
