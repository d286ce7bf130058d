"""OAI-PMH requests over one session: Identify, ListMetadataFormats and list streams.

The list stream follows resumptionTokens to exhaustion. The first request carries the
selective-harvest arguments; every continuation carries ``verb`` and
``resumptionToken`` only (I7). A token seen twice, or a run of pages that carry a token
but no records, is a loop, not progress.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from urllib.parse import urlencode

import requests

from partner_harvest.errors import (
    HarvestLoopError,
    PartnerDataError,
    PartnerHttpError,
    PartnerProtocolError,
)
from partner_harvest.oai import parse
from partner_harvest.oai.errors import BadResumptionToken, OaiProtocolError, OaiResponseError
from partner_harvest.xmlsafe import XmlInputError, XmlLimits, xml_limits

log = logging.getLogger(__name__)


class OaiClient:
    """Talks OAI-PMH to one partner endpoint; turns failures into named errors."""

    def __init__(
        self,
        partner_id: str,
        base_url: str,
        session: requests.Session,
        *,
        max_empty_pages: int = 3,
        xml_limits: XmlLimits | None = None,
    ):
        self.partner_id = partner_id
        self.base_url = base_url
        self.session = session
        self.max_empty_pages = max_empty_pages
        self.xml_limits = xml_limits or XmlLimits()

    # -- single requests ---------------------------------------------------------------

    def describe(self, params: dict[str, str]) -> str:
        return f"GET {self.base_url}?{urlencode(params)}"

    def fetch(self, params: dict[str, str]) -> bytes:
        """One OAI-PMH request; HTTP-level failures (after retries) become PartnerHttpError."""
        request = self.describe(params)
        try:
            response = self.session.get(self.base_url, params=params)
        except requests.RequestException as exc:
            raise PartnerHttpError(self.partner_id, request, f"{type(exc).__name__}: {exc}") from exc
        if response.status_code >= 400:
            snippet = " ".join(response.text[:300].split())
            raise PartnerHttpError(
                self.partner_id, request, f"HTTP {response.status_code} {response.reason}: {snippet}"
            )
        return response.content

    def call(self, params: dict[str, str], parser: Callable[[bytes], object]) -> object:
        """Fetch and parse, naming partner, request and cause on any failure (I9)."""
        content = self.fetch(params)
        request = self.describe(params)
        try:
            with xml_limits(self.xml_limits):
                return parser(content)
        except BadResumptionToken:
            raise
        except OaiProtocolError as exc:
            raise PartnerProtocolError(self.partner_id, request, f"OAI-PMH error {exc}") from exc
        except (XmlInputError, OaiResponseError) as exc:
            raise PartnerDataError(self.partner_id, request, f"unusable response: {exc}") from exc

    def identify(self) -> parse.Identify:
        return self.call({"verb": "Identify"}, parse.parse_identify)  # type: ignore[return-value]

    def metadata_prefixes(self) -> list[str]:
        formats = self.call({"verb": "ListMetadataFormats"}, parse.parse_metadata_formats)
        return [f.prefix for f in formats]  # type: ignore[attr-defined]

    def resolve_prefix(self, configured: str) -> str:
        """``auto`` means LIDO where advertised, else the mandatory oai_dc."""
        if configured != "auto":
            return configured
        prefixes = self.metadata_prefixes()
        return "lido" if "lido" in prefixes else "oai_dc"

    # -- list streams ------------------------------------------------------------------

    def list_pages(
        self,
        verb: str,
        *,
        metadata_prefix: str,
        set_spec: str | None,
        from_: str | None,
        until: str | None,
    ) -> Iterator[parse.ListPage]:
        """Yield each page of a ListRecords/ListIdentifiers chain until the token runs out.

        Raises BadResumptionToken unchanged: the caller restarts the window.
        """
        params: dict[str, str] = {"verb": verb, "metadataPrefix": metadata_prefix}
        if set_spec:
            params["set"] = set_spec
        if from_:
            params["from"] = from_
        if until:
            params["until"] = until
        if verb == "ListRecords":
            parser: Callable[[bytes], object] = lambda c: parse.parse_list_records(c, metadata_prefix)
        else:
            parser = parse.parse_list_identifiers
        seen_tokens: set[str] = set()
        empty_run = 0
        while True:
            page: parse.ListPage = self.call(params, parser)  # type: ignore[assignment]
            yield page
            token = page.token
            if not token:
                return
            if token in seen_tokens:
                raise HarvestLoopError(
                    self.partner_id, self.describe(params),
                    f"the repository handed out resumptionToken {token!r} a second time; "
                    "stopping instead of looping forever",
                )
            seen_tokens.add(token)
            empty_run = empty_run + 1 if not page.items else 0
            if empty_run > self.max_empty_pages:
                raise HarvestLoopError(
                    self.partner_id, self.describe(params),
                    f"{empty_run} pages in a row carried a resumptionToken but no records",
                )
            params = {"verb": verb, "resumptionToken": token}

