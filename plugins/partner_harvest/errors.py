"""Errors a harvest raises to Airflow: each names the partner, the request and the cause."""

from __future__ import annotations

from datetime import datetime

from partner_harvest.credentials import redact


class HarvestError(RuntimeError):
    """A harvest step failed; ``retryable`` tells the task whether a retry can help."""

    retryable = True

    def __init__(self, partner_id: str, request: str, cause: str):
        self.partner_id = partner_id
        self.request = request = redact(request)  # a request URL may carry a query credential
        self.cause = cause = redact(cause)
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


class PartnerCapExceeded(HarvestError):
    """The partner passed a cap of the registry (options.limits): a token too long, a chain
    longer than its list can justify, a run staging too much. Retrying would meet it again."""

    retryable = False


class ConfigurationError(HarvestError):
    """Bad credentials, a bad prefix, a bad registry entry: retrying will not help."""

    retryable = False


class PartnerAsksToWait(HarvestError):
    """The partner asked us to come back at ``resume_at`` (a rate limit, another run's lease).

    Not a failure: the task gives its worker slot back and runs again at ``resume_at``
    (the Airflow layer turns this into a reschedule); what was staged so far is kept.
    """

    def __init__(self, partner_id: str, request: str, cause: str, resume_at: datetime):
        super().__init__(partner_id, request, f"{cause}; resuming at {resume_at:%Y-%m-%d %H:%M:%S}Z")
        self.resume_at = resume_at


class PartnerNotReady(HarvestError):
    """What the run read is not yet what the partner publishes, though the freeze judged it
    complete (a file not matching its published checksum: still being uploaded).

    Not a failure: nothing of the run applies, its staging is dropped, the cursor stays
    (``run.wait``); the next run freezes again and applies once the partner's files match.
    The Airflow layer skips the rest of the run, without a failure alert.
    """
