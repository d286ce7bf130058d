"""IIIF Change Discovery as the rest of the harvester sees it (protocols.ProtocolSpec): light."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

from pydantic import Field, StrictInt, StrictStr

from partner_harvest.protocols import ConnectionType, OptionsKey, ProtocolSpec, StrictOptions

if TYPE_CHECKING:
    from partner_harvest.adapters import Adapter
    from partner_harvest.factory import Wiring
    from partner_harvest.readiness import Probe


class SeeAlsoChoice(StrictOptions):
    """One entry of options.iiif.descriptions: a seeAlso matched by media type and/or profile."""

    prefix: StrictStr = Field(description=(
        "the format the description is stored and validated as (linked_art, lido, or another prefix: "
        "stored unchecked by the generic rules)"))
    format: StrictStr | None = Field(default=None, description=(
        "the seeAlso's format (media type) must start with this, parameters ignored (e.g. application/ld+json)"))
    profile: StrictStr | None = Field(default=None, description=(
        "the seeAlso's profile must contain this (e.g. linked.art, lido-schema.org)"))


DEFAULT_SEE_ALSO = (
    SeeAlsoChoice(prefix="linked_art", profile="linked.art"),
    SeeAlsoChoice(prefix="lido", profile="lido-schema.org"),
    SeeAlsoChoice(prefix="linked_art", format="application/ld+json"),
)


class IiifOptions(StrictOptions):
    """options.iiif (IIIF Change Discovery only): which description to fetch, and how politely."""

    descriptions: tuple[SeeAlsoChoice, ...] = Field(default=DEFAULT_SEE_ALSO, min_length=1, description=(
        "the object's seeAlso to fetch, in order of preference (the first entry any seeAlso matches wins); "
        "metadata_prefix auto uses the whole list, a named prefix only its entries"))
    description_concurrency: Annotated[StrictInt, Field(ge=1, le=64, description=(
        "descriptions fetched at once within one task; never more than the partner's pool_slots (a slice of a "
        "sliced full harvest fetches one at a time: up to pool_slots slices run at once)"))] = 4
    page_delay: Annotated[float, Field(ge=0, le=60, strict=True, description=(
        "seconds between two requests for stream pages (politeness; descriptions are paced by the pool)"))] = 0.0
    max_pages: Annotated[StrictInt, Field(ge=1, description=(
        "stream pages one run may walk; a longer walk fails naming the cap"))] = 100_000
    object_types: tuple[StrictStr, ...] = Field(default=(), description=(
        "object types harvested (e.g. HumanMadeObject, Manifest); empty: every type"))
    object_itself: StrictStr | None = Field(default=None, description=(
        "when no seeAlso matches (or none is given), fetch the object's own id as this format "
        "(e.g. linked_art: the Getty's stream links each object's Linked Art record by its id alone); "
        "null: such an object is quarantined naming what was offered"))


def build(wiring: Wiring) -> Adapter:
    from partner_harvest.iiif.client import IiifClient
    from partner_harvest.iiif.harvester import IiifAdapter

    options: IiifOptions = wiring.partner.options.iiif
    client = IiifClient(wiring.partner.id, wiring.endpoint.base_url, wiring.session, page_delay=options.page_delay,
                        max_pages=options.max_pages, session_factory=wiring.new_session)
    return IiifAdapter(wiring.partner, client)



def check(probe: Probe) -> None:
    from partner_harvest.iiif.readiness import check as probes

    probes(probe)

SPEC = ProtocolSpec(
    name="iiif-change-discovery",
    title="IIIF Change Discovery",
    build=build,
    stack="partner_harvest.iiif.harvester",
    check=check,
    connection=ConnectionType(
        conn_type="iiif_change_discovery", hook_class="IiifChangeDiscoveryHook",
        hook_name="IIIF Change Discovery partner",
        doc="An IIIF Change Discovery stream: host = the URL of its OrderedCollection.",
        hidden_fields=("schema", "port"),
        relabeling={"host": "Stream URL"},
        placeholders={"host": "https://museum.example/iiif/activity/all-changes (the OrderedCollection)"},
    ),
    docs="docs/design/iiif.md",
    default_prefix="auto",
    options={"iiif": OptionsKey(IiifOptions, "IIIF Change Discovery only: descriptions and politeness")},
)
