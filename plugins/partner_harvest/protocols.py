"""The protocols the harvester speaks, each declared once.

A protocol is a package of its own (``partner_harvest/<package>/``) whose ``spec.py``
declares its :class:`ProtocolSpec` as ``SPEC``. A spec module is light (pydantic and this
module; the HTTP stack is imported only when an adapter is built), so the registry, the DAG
files and every Airflow process read it cheaply. Everything outside the protocol's package
reads the spec instead of naming the protocol: the registry's ``protocol`` field, its
protocol options and default prefix, the adapter factory, the Airflow connection types and
their hooks, the DAG's task per extra channel, the approval gate, the quiet night and the
command line. Adding a protocol is one package with its ``spec.py`` (docs/design/adapters.md).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict

if TYPE_CHECKING:
    from partner_harvest.adapters import Adapter
    from partner_harvest.factory import Wiring
    from partner_harvest.readiness import Probe
    from partner_harvest.registry import Partner


class StrictOptions(BaseModel):
    """The base of every registry model: unknown keys are errors (a typo is never silently
    ignored), values frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True)


@dataclass(frozen=True)
class Channel:
    """A stream besides ``changes``: harvested by a task of its own (``task_id``) into the
    run's staging, applied in the same transaction, on a cursor of its own
    (``harvest_cursor__<id>__<name>``). The adapter plans its window (``plan_channels``)
    and streams it (``harvest_channel``)."""

    name: str  # the staging channel and the cursor key's suffix, e.g. deletions
    task_id: str  # its task in the harvest DAG, e.g. poll_deletions
    granularity: str  # its cursor's: window.DAY or window.SECONDS
    summary: str  # how the DAG's description names it ("the deleted bibs, on their own day cursor")
    doc: str  # the task's documentation in the Airflow UI
    entity: str | None = None  # the attached records' table its items land in (items, holdings); None: records


@dataclass(frozen=True)
class ConnectionType:
    """The Airflow connection type of the protocol's partners: declared by the provider
    (airflow/provider.py, with the form's fields) and read by a hook class of that name that
    airflow/hooks.py makes for it. Connections of type ``http`` are accepted too."""

    conn_type: str  # e.g. oai_pmh
    hook_class: str  # the hook's class name in partner_harvest.airflow.hooks, e.g. OaiPmhHook
    hook_name: str  # the form's label, e.g. "OAI-PMH partner"
    doc: str  # the hook's docstring: what the Connection's fields hold
    hidden_fields: tuple[str, ...] = ()
    relabeling: Mapping[str, str] = field(default_factory=dict)
    placeholders: Mapping[str, str] = field(default_factory=dict)
    object_storage: bool = False
    """The host is an object-storage URL (s3://bucket/prefix): the hook opens it through Airflow's
    object storage (``ObjectStoragePath``, for a scheme a provider registers) as ``Endpoint.filesystem``,
    and the form shows the ``fields`` below instead of the HTTP transport's TLS and proxy fields."""
    fields: Mapping[str, tuple[str, str]] = field(default_factory=dict)  # extra -> (label, description) on the form


@dataclass(frozen=True)
class OptionsKey:
    """One key of the registry's ``options`` that belongs to the protocol: its model and its
    description; the registry refuses it for a partner of another protocol."""

    model: type[StrictOptions]
    description: str


@dataclass(frozen=True)
class ProtocolSpec:
    """Everything outside a protocol's package needs to know about it."""

    name: str  # the registry's `protocol` value, the lineage scheme of its endpoints
    title: str  # how people name it ("OAI-PMH")
    build: Callable[[Wiring], Adapter]  # the partner's adapter from its session (imports the stack lazily)
    stack: str  # the module of its adapter, which ``build`` imports; airflow/preload.py imports it before a fork
    connection: ConnectionType
    docs: str  # its design page, e.g. docs/design/oai.md
    channels: tuple[Channel, ...] = ()  # extra channels, each with a task and a cursor of its own
    quiet_night: bool = False  # whether freeze_window asks the adapter's window_is_empty (airflow/quiet.py)
    default_prefix: str = "auto"  # the registry's metadata_prefix when the entry gives none
    options: Mapping[str, OptionsKey] = field(default_factory=dict)  # its keys of the registry's `options`
    sets: bool = False  # whether partners select sets (the registry's set, sets, exclude_sets, slicing.sets)
    session_credentials: bool = True
    """Whether the Connection's login, password and credential extras authenticate the partner's
    session (credentials.py); False where the client logs in with them itself (Sierra's API key)."""
    schemes: tuple[str, ...] = ("https", "http")  # of its endpoints' URLs: the lineage asset schemes <name>+<scheme>
    client_statuses: frozenset[int] = frozenset()
    """HTTP statuses the protocol's client reads itself: the transport does not retry them unless
    the registry's options.http.retry_statuses says otherwise (Sierra's 500s carry error codes,
    its 429s a wait the harvester weighs)."""
    check: Callable[[Probe], None] | None = None
    """Its readiness probes (``partner-harvest check``, readiness.py): what the harvest will rely
    on, asked of the endpoint in a few paced requests, each answer a finding on the probe
    (imports its stack lazily, as ``build``). None: the command says there is none yet."""
    chosen_channels: Callable[[Partner], Collection[str]] | None = None
    """The names of the extra channels a partner's registry entry asks for (Sierra's
    options.sierra.channels); None: every channel, for every partner."""

    def channels_for(self, partner: Partner) -> tuple[Channel, ...]:
        """The extra channels of ``partner``: the DAG's tasks, the run's windows and cursors."""
        if self.chosen_channels is None:
            return self.channels
        chosen = set(self.chosen_channels(partner))
        return tuple(channel for channel in self.channels if channel.name in chosen)


@cache
def specs() -> tuple[ProtocolSpec, ...]:
    """Every protocol: the ``SPEC`` of each package of partner_harvest that has a ``spec.py``,
    by name (found on the file system: nothing is imported that is not a spec)."""
    here = Path(__file__).resolve().parent
    found = [importlib.import_module(f"{__package__}.{path.parent.name}.spec").SPEC
             for path in sorted(here.glob("*/spec.py"))]
    return tuple(sorted(found, key=lambda spec: spec.name))


def names() -> tuple[str, ...]:
    """The registry's ``protocol`` values."""
    return tuple(spec.name for spec in specs())


def spec_of(name: str) -> ProtocolSpec:
    """The protocol named ``name``; ValueError naming the known ones otherwise."""
    for spec in specs():
        if spec.name == name:
            return spec
    raise ValueError(f"protocol {name!r} is not one of {', '.join(names())}")


def channels() -> dict[str, Channel]:
    """Every protocol's extra channels by name (the command line's cursor choices)."""
    return {channel.name: channel for spec in specs() for channel in spec.channels}


def channels_for(partner: Partner) -> tuple[Channel, ...]:
    """The partner's extra channels: those of its protocol its registry entry asks for."""
    return spec_of(partner.protocol).channels_for(partner)
