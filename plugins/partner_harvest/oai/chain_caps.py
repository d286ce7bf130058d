"""Caps one OAI-PMH token chain cannot pass: a token's size, the chain's pages.

Nothing in OAI-PMH bounds a resumptionToken's length or a chain's length; a hostile (or
broken) repository could grow a worker's memory or hold it for hours with either. The
loop guard keeps a digest of each token, never the token: its memory does not grow with
the tokens' size. The pages a chain may have are what its announced ``completeListSize``
justifies at the size of its first page (times a slack: lists grow while they are read,
servers trim pages), and never more than an absolute cap (a repository that announces
nothing, or announces too much).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

from partner_harvest.registry import (
    DEFAULT_CHAIN_PAGES_SLACK,
    DEFAULT_MAX_CHAIN_PAGES,
    DEFAULT_MAX_TOKEN_BYTES,
    LimitsOptions,
)


@dataclass(frozen=True)
class ChainCaps:
    """The partner's caps (registry ``options.limits``)."""

    max_token_bytes: int = DEFAULT_MAX_TOKEN_BYTES
    pages_slack: float = DEFAULT_CHAIN_PAGES_SLACK
    max_pages: int = DEFAULT_MAX_CHAIN_PAGES

    @classmethod
    def from_limits(cls, limits: LimitsOptions) -> ChainCaps:
        return cls(limits.max_token_bytes, limits.chain_pages_slack, limits.max_chain_pages)

    def token_problem(self, token: str) -> str | None:
        """Why ``token`` may not be followed (too long), else None; never copies it whole."""
        size = len(token) if token.isascii() else len(token.encode("utf-8", "surrogatepass"))
        if size <= self.max_token_bytes:
            return None
        return (f"the repository handed out a resumptionToken of {size} bytes, over the cap "
                f"options.limits.max_token_bytes = {self.max_token_bytes} (token starts {token[:40]!r})")

    def pages_problem(self, pages: int, list_size: int | None, page_size: int | None, empty_allowed: int) -> str | None:
        """Why a chain at its ``pages``-th page must stop, else None."""
        if pages > self.max_pages:
            return (f"the chain reached page {pages}, over the cap options.limits.max_chain_pages = "
                    f"{self.max_pages}")
        if list_size is None or not page_size:
            return None
        justified = math.ceil(self.pages_slack * max(list_size, 1) / page_size) + empty_allowed + 1
        if pages <= justified:
            return None
        return (f"the chain reached page {pages}, more than its completeListSize {list_size} justifies at "
                f"{page_size} items a page: {justified} pages with options.limits.chain_pages_slack = "
                f"{self.pages_slack:g}")


def token_digest(token: str) -> bytes:
    """What the loop guard keeps of a token: 32 bytes whatever the token's size."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


def short_params(params: dict[str, str], keep: int = 80) -> dict[str, str]:
    """The request's arguments with a long token cut, for a one-line error naming it."""
    token = params.get("resumptionToken")
    if token is None or len(token) <= keep:
        return params
    return {**params, "resumptionToken": f"{token[:keep]}...({len(token)} characters)"}
