"""Loopback OAI-PMH 2.0 partner simulator for integration tests, benchmarks and demos.

Typical use::

    repo = SimulatedRepository(records=5000, page_size=200)
    with OaiSimulator(repo) as sim:
        harvest(sim.base_url)
        repo.edit(10)
        sim.expire_tokens_after(2)
"""

from .collection import (
    DEPARTMENTS,
    SETS,
    TYPES,
    Record,
    SimulatedRepository,
    identifier_for,
    number_for,
    parse_oai_date,
)
from .payloads import title
from .server import OaiError, OaiSimulator, Response

__all__ = [
    "DEPARTMENTS",
    "SETS",
    "TYPES",
    "OaiError",
    "OaiSimulator",
    "Record",
    "Response",
    "SimulatedRepository",
    "identifier_for",
    "number_for",
    "parse_oai_date",
    "title",
]
