"""The old code paths benchmarks measure the library against, kept here, not in the library.

A production class carries no switch that only a benchmark flips: a baseline is a
subclass or a replacement installed by the benchmark's own (child) process.
tests/unit/test_benchmark_levers.py checks that each one still names code that exists
(a baseline overriding a renamed method would measure the new code and call it old).
"""

from __future__ import annotations

from collections.abc import Iterator

from partner_harvest.oai import parse
from partner_harvest.oai.client import OaiClient
from partner_harvest.sierra import marc


class SequentialOaiClient(OaiClient):
    """The chain one page at a time: page N+1 is requested only after the caller is done
    with page N (the client before pipelining: its gain is measured against this)."""

    def _pipelined_pages(self, verb: str, prefix: str | None, params: dict[str, str],
                         ahead: bool = True) -> Iterator[parse.ListPage]:
        return super()._pipelined_pages(verb, prefix, params, ahead=False)


def sequential(client: OaiClient) -> OaiClient:
    """Turn one adapter's OAI-PMH client into the sequential baseline (this object only)."""
    if not isinstance(client, OaiClient):
        raise TypeError(f"not an OaiClient: {client!r}")
    client.__class__ = SequentialOaiClient
    return client


def _no_fast_path(raw: bytes) -> None:
    return None  # "not decodable on the fast path": the harvester falls back to pymarc


def pymarc_for_every_record() -> None:
    """Every Sierra export record through pymarc and lxml (the decoding before the fast UTF-8
    path), for the rest of this process: call it only in a benchmark's child process."""
    marc.decode_fast = _no_fast_path
