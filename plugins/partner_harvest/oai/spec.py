"""OAI-PMH as the rest of the harvester sees it (protocols.ProtocolSpec): light, no HTTP stack."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import Field, StrictInt

from partner_harvest.protocols import ConnectionType, OptionsKey, ProtocolSpec, StrictOptions

if TYPE_CHECKING:
    from partner_harvest.adapters import Adapter
    from partner_harvest.factory import Wiring
    from partner_harvest.readiness import Probe


class OaiOptions(StrictOptions):
    """options.oai (OAI-PMH): how a window is listed, and how far one the repository refuses
    as too large is cut."""

    method: Literal["list_records", "identifiers_then_get"] = Field(default="list_records", description=(
        "list_records: ListRecords of the window; identifiers_then_get: ListIdentifiers of the window, then "
        "GetRecord of each live header (pool_slots at a time, paced), for servers whose ListRecords breaks; "
        "deleted headers are deletions without a GetRecord"))

    max_window_splits: Annotated[StrictInt, Field(ge=0, le=30, description=(
        "halvings of a window the repository refuses as too large (HTTP 413, 422, or badArgument saying "
        "so) before the run fails; 12 cut a year into pieces of about two hours"))] = 12


class ReconcileOptions(StrictOptions):
    """options.reconcile (OAI-PMH): how much of a reconcile's work one run does."""

    verify_limit: Annotated[StrictInt, Field(ge=1, description=(
        "vanished records confirmed with GetRecord per reconcile before they are purged; the rest are "
        "kept and verified by the next reconcile"))] = 1000
    bulk_missing_threshold: Annotated[StrictInt, Field(ge=1, description=(
        "more records missing locally than this come back through one ListRecords stream instead of "
        "one GetRecord each"))] = 500


def build(wiring: Wiring) -> Adapter:
    from partner_harvest.oai.chain_caps import ChainCaps
    from partner_harvest.oai.client import OaiClient
    from partner_harvest.oai.harvester import OaiAdapter
    from partner_harvest.xmlsafe import XmlLimits

    partner = wiring.partner
    client = OaiClient(partner.id, wiring.endpoint.base_url, wiring.session,
                       xml_limits=XmlLimits(wiring.policy.max_xml_nodes),
                       caps=ChainCaps.from_limits(partner.options.limits))
    return OaiAdapter(partner, client)



def check(probe: Probe) -> None:
    from partner_harvest.oai.readiness import check as probes

    probes(probe)

SPEC = ProtocolSpec(
    name="oai-pmh",
    title="OAI-PMH",
    build=build,
    stack="partner_harvest.oai.harvester",
    check=check,
    connection=ConnectionType(
        conn_type="oai_pmh", hook_class="OaiPmhHook", hook_name="OAI-PMH partner",
        doc="An OAI-PMH repository: host = the base URL (``https://museum.example/oai``).",
        hidden_fields=("schema", "port"),
        relabeling={"host": "Base URL"},
        placeholders={"host": "https://museum.example/oai (the URL before ?verb=)"},
    ),
    docs="docs/design/oai.md",
    quiet_night=True,
    default_prefix="auto",
    options={
        "oai": OptionsKey(OaiOptions, "OAI-PMH only: window splitting"),
        "reconcile": OptionsKey(ReconcileOptions, "OAI-PMH only: how much of a reconcile's work one run does"),
    },
    sets=True,
)
