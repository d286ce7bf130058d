"""Errors a harvest raises to Airflow: each names the partner, the request and the cause."""

from __future__ import annotations


class HarvestError(RuntimeError):
    """A harvest step failed; ``retryable`` tells the task whether a retry can help."""

    retryable = True

    def __init__(self, partner_id: str, request: str, cause: str):
        self.partner_id = partner_id
        self.request = request
        self.cause = cause
        super().__init__(f"partner '{partner_id}': {cause} (request: {request})")


class PartnerHttpError(HarvestError):
    """The partner answered with an HTTP error after all retries."""


class PartnerDataError(HarvestError):
    """The partner's response is unusable (broken or hostile XML, HTML, not the protocol)."""


class PartnerProtocolError(HarvestError):
    """The partner answered with a protocol error (an OAI-PMH <error>, a Sierra error code)."""


class HarvestLoopError(HarvestError):
    """The partner's pagination does not progress (repeated token, endless empty pages)."""

    retryable = False


class ConfigurationError(HarvestError):
    """Bad credentials, a bad prefix, a bad registry entry: retrying will not help."""

    retryable = False
