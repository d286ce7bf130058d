"""The partner registry: which partners exist and how each is harvested.

Loaded from ``include/partners.yaml`` (or ``$HARVEST_PARTNERS_FILE``) at DAG-parse time,
so a bad entry must fail loudly with the file, the partner and the field in the message.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import yaml

PARTNERS_FILE_ENV = "HARVEST_PARTNERS_FILE"
DEFAULT_PARTNERS_FILE = Path(__file__).resolve().parents[2] / "include" / "partners.yaml"

PROTOCOLS = ("oai-pmh", "sierra")
_ID_PATTERN = re.compile(r"^[a-z][a-z0-9_]{0,62}$")
_DURATION = re.compile(r"^\s*(\d+)\s*([smhd]?)\s*$")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


class RegistryError(ValueError):
    """The registry file is unusable; the message names file, partner and field."""

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


@dataclass(frozen=True)
class Partner:
    """One partner repository and the knobs its DAG is built from."""

    id: str
    protocol: str
    conn_id: str
    schedule: str = "0 2 * * *"
    lag: timedelta = timedelta(minutes=10)
    metadata_prefix: str = "auto"
    set_spec: str | None = None
    description: str = ""
    max_token_restarts: int = 3
    page_size: int = 2000
    fields: tuple[str, ...] = ()
    deletion_overlap_days: int = 1
    pool_slots: int = 1
    retries: int = 3
    reconcile_schedule: str = "0 4 * * 0"
    max_purge_fraction: float = 0.05
    quarantine_alert_rate: float = 0.05
    purge_alert_fraction: float = 0.05
    quiet_period: timedelta = timedelta(days=7)
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def dag_id(self) -> str:
        return f"harvest_{self.id}"

    @property
    def cursor_key(self) -> str:
        return f"harvest_cursor__{self.id}"

    @property
    def reconcile_dag_id(self) -> str:
        return f"reconcile_{self.id}"

    @property
    def pool(self) -> str:
        """The Airflow pool that bounds concurrent requests to this partner's endpoint."""
        return f"partner_{self.id}"


def parse_duration(value: Any) -> timedelta:
    """Accept ``600``, ``"600s"``, ``"10m"``, ``"2h"`` or ``"1d"``."""
    if isinstance(value, bool):
        raise ValueError(f"not a duration: {value!r}")
    if isinstance(value, (int, float)) and value >= 0:
        return timedelta(seconds=value)
    match = _DURATION.match(str(value))
    if not match:
        raise ValueError(f"not a duration: {value!r} (use seconds or e.g. '10m', '2h', '1d')")
    return timedelta(seconds=int(match.group(1)) * _UNITS[match.group(2)])


def partners_file() -> Path:
    return Path(os.environ.get(PARTNERS_FILE_ENV) or DEFAULT_PARTNERS_FILE)


def load_partners(path: Path | str | None = None) -> list[Partner]:
    """Read and validate every partner; sorted by id so DAG generation is stable."""
    path = Path(path) if path else partners_file()
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RegistryError(path, None, None, "file not found") from None
    except yaml.YAMLError as exc:
        raise RegistryError(path, None, None, f"not valid YAML: {exc}") from None
    entries = raw.get("partners") if isinstance(raw, dict) else None
    if not isinstance(entries, list):
        raise RegistryError(path, None, "partners", "expected a top-level 'partners:' list")
    partners: list[Partner] = []
    seen: set[str] = set()
    for index, entry in enumerate(entries):
        partner = _parse_partner(path, index, entry)
        if partner.id in seen:
            raise RegistryError(path, partner.id, "id", "duplicate partner id")
        seen.add(partner.id)
        partners.append(partner)
    return sorted(partners, key=lambda p: p.id)


def get_partner(partner_id: str, path: Path | str | None = None) -> Partner:
    for partner in load_partners(path):
        if partner.id == partner_id:
            return partner
    raise RegistryError(path or partners_file(), partner_id, "id", "no such partner in the registry")


_KNOWN_FIELDS = {
    "id", "protocol", "conn_id", "schedule", "lag", "metadata_prefix", "set", "description",
    "max_token_restarts", "page_size", "fields", "deletion_overlap_days", "pool_slots", "options",
    "retries", "reconcile_schedule", "max_purge_fraction", "quarantine_alert_rate",
    "purge_alert_fraction", "quiet_period",
}


def _parse_partner(path: Path, index: int, entry: Any) -> Partner:
    if not isinstance(entry, dict):
        raise RegistryError(path, f"#{index + 1}", None, "each partner must be a mapping")
    pid = entry.get("id")
    label = str(pid) if pid else f"#{index + 1}"

    def fail(field_name: str, problem: str) -> RegistryError:
        return RegistryError(path, label, field_name, problem)

    unknown = sorted(set(entry) - _KNOWN_FIELDS)
    if unknown:
        raise fail(unknown[0], f"unknown field (known: {', '.join(sorted(_KNOWN_FIELDS))})")
    if not isinstance(pid, str) or not _ID_PATTERN.match(pid):
        raise fail("id", "must be a slug: lowercase letters, digits and '_', starting with a letter")
    protocol = entry.get("protocol")
    if protocol not in PROTOCOLS:
        raise fail("protocol", f"must be one of {', '.join(PROTOCOLS)}, got {protocol!r}")
    conn_id = entry.get("conn_id")
    if not isinstance(conn_id, str) or not conn_id.strip():
        raise fail("conn_id", "required: the Airflow Connection whose host is the endpoint")
    schedules = {}
    for name in ("schedule", "reconcile_schedule"):
        value = entry.get(name, getattr(Partner, name))
        if not isinstance(value, str) or len(value.split()) != 5:
            raise fail(name, f"must be a five-field cron expression, got {value!r}")
        schedules[name] = value
    fractions = {}
    for name in ("max_purge_fraction", "quarantine_alert_rate", "purge_alert_fraction"):
        value = entry.get(name, getattr(Partner, name))
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
            raise fail(name, f"must be a fraction from 0 to 1, got {value!r}")
        fractions[name] = float(value)
    try:
        quiet_period = parse_duration(entry.get("quiet_period", "7d"))
    except ValueError as exc:
        raise fail("quiet_period", str(exc)) from None
    try:
        lag = parse_duration(entry.get("lag", "10m"))
    except ValueError as exc:
        raise fail("lag", str(exc)) from None
    prefix = entry.get("metadata_prefix", "auto" if protocol == "oai-pmh" else "marc21")
    if not isinstance(prefix, str) or not prefix.strip():
        raise fail("metadata_prefix", "must be a metadata prefix or 'auto'")
    set_spec = entry.get("set")
    if set_spec is not None and (not isinstance(set_spec, str) or not set_spec.strip()):
        raise fail("set", "must be a non-empty setSpec when given")
    ints = {}
    for name, default, low, high in (
        ("max_token_restarts", 3, 0, 100),
        ("page_size", 2000, 1, 2000),
        ("deletion_overlap_days", 1, 0, 365),
        ("pool_slots", 1, 1, 64),
        ("retries", 3, 0, 10),
    ):
        value = entry.get(name, default)
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise fail(name, f"must be an integer from {low} to {high}, got {value!r}")
        ints[name] = value
    fields_value = entry.get("fields", [])
    if isinstance(fields_value, str):
        fields_value = [f.strip() for f in fields_value.split(",") if f.strip()]
    if not isinstance(fields_value, list) or not all(isinstance(f, str) for f in fields_value):
        raise fail("fields", "must be a list of field names")
    options = entry.get("options", {})
    if not isinstance(options, dict):
        raise fail("options", "must be a mapping")
    return Partner(
        id=pid,
        protocol=protocol,
        conn_id=conn_id.strip(),
        quiet_period=quiet_period,
        **schedules,
        **fractions,
        lag=lag,
        metadata_prefix=prefix.strip(),
        set_spec=set_spec,
        description=str(entry.get("description", "")),
        fields=tuple(fields_value),
        options=dict(options),
        **ints,
    )
