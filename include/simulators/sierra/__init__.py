"""Loopback Sierra ILS REST API (v6) simulator for integration tests, benchmarks and demos.

Typical use::

    catalogue = SimulatedCatalogue(bibs=5000, oversized_every=500)
    with SierraSimulator(catalogue, export_quota=100) as sim:
        harvest(sim.base_url, key="demo-key", secret="demo-secret")
        catalogue.edit(10)
        sim.expire_tokens()
"""

from .catalogue import Bib, BibQuery, SimulatedCatalogue, check_digit, day_text, iso_z
from .marc import (
    EXPORT_ONLY_TAGS,
    MAX_RECORD_BYTES,
    bib_marc,
    encode,
    export_record,
    marc_fields,
    marc_in_json,
    marc_xml,
)
from .server import (
    ALL_FIELDS,
    API_PATH,
    DEFAULT_FIELDS,
    ApiError,
    Response,
    SierraSimulator,
    parse_date_range,
    parse_fields,
    parse_ids,
    render_entry,
)

__all__ = [
    "ALL_FIELDS",
    "API_PATH",
    "DEFAULT_FIELDS",
    "EXPORT_ONLY_TAGS",
    "MAX_RECORD_BYTES",
    "ApiError",
    "Bib",
    "BibQuery",
    "Response",
    "SierraSimulator",
    "SimulatedCatalogue",
    "bib_marc",
    "check_digit",
    "day_text",
    "encode",
    "export_record",
    "iso_z",
    "marc_fields",
    "marc_in_json",
    "marc_xml",
    "parse_date_range",
    "parse_fields",
    "parse_ids",
    "render_entry",
]
