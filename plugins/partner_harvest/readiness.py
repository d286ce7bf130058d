"""The readiness check of a partner's endpoint (``partner-harvest check``), before it is onboarded.

A partner's staff and the aggregator both want to know, before the first night, whether the
harvest will work: what the endpoint does that the harvest relies on, what it does not, and
what to fix on which side. Each protocol declares its probes once, in its spec
(``protocols.ProtocolSpec.check``: a function of a :class:`Probe`, in the protocol's own
package); this module runs them on the adapter a harvest would build (the same session:
credentials, limits, retries), and renders what they found for people (text) and for
scripts (JSON, and the exit status). A protocol without probes says so.

The check is a guest: its requests are few and bounded (``CheckSettings.max_requests``, on
the wire, retries included: :class:`RequestBudget` paces the session and refuses the request
past the budget) and paced (``CheckSettings.delay`` seconds apart, at least the partner's
``request_delay``). Nothing is written anywhere: no database, no Airflow.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from partner_harvest import protocols
from partner_harvest.credentials import redact, remember
from partner_harvest.errors import HarvestError
from partner_harvest.records import HarvestItem, Record, Rejected

if TYPE_CHECKING:
    from partner_harvest.adapters import Adapter
    from partner_harvest.factory import Endpoint
    from partner_harvest.registry import Partner

OK, WARN, FAIL, INFO = "ok", "warn", "fail", "info"
_LABELS = {OK: "OK", WARN: "WARN", FAIL: "FAIL", INFO: "NOTE"}


@dataclass(frozen=True)
class Finding:
    """One thing a probe found: ``ok`` works, ``warn`` works with a cost or a risk, ``fail``
    will not work, ``info`` is said only. ``fault`` names a problem in a word scripts and
    tests can match (``from-ignored``); ``fix`` says what to change, and on which side."""

    status: str
    subject: str
    detail: str
    fix: str = ""
    fault: str = ""

    def to_json(self) -> dict[str, str]:
        return {"status": self.status, "subject": self.subject, "detail": redact(self.detail),
                "fix": redact(self.fix), "fault": self.fault}


@dataclass(frozen=True)
class CheckSettings:
    """How hard the check may press: seconds between requests, the pause a resumptionToken
    waits before it is used, the most requests it sends (retries included)."""

    delay: float = 1.0
    pause: float = 30.0
    max_requests: int = 40


class BudgetSpent(Exception):
    """The check's request budget is spent: the request was not sent. Raised inside the
    transport on purpose (not an OSError), so nothing retries it."""


class RequestBudget:
    """The check's pacer (transport.RequestPacer): ``delay`` seconds between two requests on
    the wire, and none past ``max_requests``."""

    def __init__(self, settings: CheckSettings, sleep: Callable[[float], None] = time.sleep):
        self.settings = settings
        self.sleep = sleep
        self.sent = 0
        self._last: float | None = None
        self._lock = threading.Lock()

    def before(self) -> float:
        with self._lock:
            if self.sent >= self.settings.max_requests:
                raise BudgetSpent(f"the check's budget of {self.settings.max_requests} requests is spent")
            self.sent += 1
            wait = 0.0 if self._last is None else max(0.0, self.settings.delay - (time.monotonic() - self._last))
            self._last = time.monotonic() + wait
        if wait:
            self.sleep(wait)
        return wait

    def after(self, seconds: float, status: int | None) -> None:
        with self._lock:
            self._last = time.monotonic()

    def judged_by_caller(self) -> AbstractContextManager[None]:
        return nullcontext()

    def excuse(self) -> None:
        return None

    def close(self) -> None:
        return None


@dataclass
class Probe:
    """What a protocol's probes work with: the partner's entry, the adapter a harvest would
    build (its session paced by the check's budget), the settings, and the findings so far."""

    partner: Partner
    adapter: Adapter
    settings: CheckSettings
    sleep: Callable[[float], None] = time.sleep
    findings: list[Finding] = field(default_factory=list)

    def ok(self, subject: str, detail: str) -> None:
        self.findings.append(Finding(OK, subject, detail))

    def info(self, subject: str, detail: str, fix: str = "", fault: str = "") -> None:
        self.findings.append(Finding(INFO, subject, detail, fix, fault))

    def warn(self, subject: str, detail: str, fix: str, fault: str) -> None:
        self.findings.append(Finding(WARN, subject, detail, fix, fault))

    def fail(self, subject: str, detail: str, fix: str, fault: str) -> None:
        self.findings.append(Finding(FAIL, subject, detail, fix, fault))

    def named(self, fault: str) -> bool:
        """Whether a finding so far names ``fault``."""
        return any(f.fault == fault for f in self.findings)

    def validated(self, items: list[HarvestItem], what: str) -> None:
        """A sample through the partner's validation, as the harvest judged it: the records
        it would quarantine named with their reasons (all of them quarantined: a failure)."""
        records = [i for i in items if isinstance(i, Record)]
        rejected = [i for i in items if isinstance(i, Rejected)]
        warned = sorted({w.check for r in records for w in r.warnings})
        if rejected:
            reasons = listed(sorted({one_line(r.reason, 100) for r in rejected}), 3)
            text = f"{len(rejected)} of {len(records) + len(rejected)} of {what} would be quarantined, not held: {reasons}"
            fix = ("the partner can correct the records (the quarantine names each with its reason); "
                   "options.validation can turn an overridable check into a warning")
            (self.warn if records else self.fail)("validation", text, fix, "records-rejected")
            return
        if not records:
            self.info("validation", f"{what}: only deletions, nothing to validate")
            return
        note = f"; warnings: {listed(warned)}" if warned else ""
        self.ok("validation", f"{len(records)} of {what} pass validation as {records[0].metadata_prefix}{note}")


@dataclass
class Report:
    """What ``partner-harvest check`` prints: the findings, and how it went."""

    subject: str  # the partner and its protocol, or the URL checked
    endpoint: str
    findings: list[Finding]
    requests: int
    settings: CheckSettings
    checked: bool = True

    @property
    def verdict(self) -> str:
        if not self.checked:
            return "not checked"
        return "not ready" if any(f.status == FAIL for f in self.findings) else "ready"

    @property
    def exit_status(self) -> int:
        """0 ready (warnings allowed) or nothing to check; 1 something will not work."""
        return 1 if self.verdict == "not ready" else 0

    def counts(self) -> dict[str, int]:
        return {status: sum(1 for f in self.findings if f.status == status) for status in (OK, WARN, FAIL, INFO)}

    def text(self) -> str:
        lines = [f"Readiness of {self.subject} at {self.endpoint}", ""]
        for finding in self.findings:
            fault = f" [{finding.fault}]" if finding.fault else ""
            lines.append(f"{_LABELS[finding.status]:<5} {finding.subject}{fault}: {finding.detail}")
            if finding.fix:
                lines.append(f"      fix: {finding.fix}")
        counts = self.counts()
        summary = {"ready": "READY: the harvest can rely on what it needs",
                   "not ready": f"NOT READY: {counts[FAIL]} thing(s) will not work",
                   "not checked": "NOT CHECKED"}[self.verdict]
        if counts[WARN]:
            summary += f", {counts[WARN]} warning(s)"
        lines += ["", f"{summary} ({self.requests} request(s), {self.settings.delay:g} s apart)"]
        return redact("\n".join(lines)) + "\n"

    def to_json(self) -> dict[str, Any]:
        return {"subject": self.subject, "endpoint": redact(self.endpoint), "verdict": self.verdict,
                "checked": self.checked, "requests": self.requests, "counts": self.counts(),
                "findings": [f.to_json() for f in self.findings]}


def run_check(partner: Partner, endpoint: Endpoint, settings: CheckSettings, *, subject: str | None = None,
              sleep: Callable[[float], None] = time.sleep) -> Report:
    """Run the partner's protocol's probes against ``endpoint``; a protocol without probes
    (``ProtocolSpec.check`` None) is reported as not checked, never as failing."""
    from partner_harvest.factory import build_adapter

    spec = protocols.spec_of(partner.protocol)
    subject = subject or f"partner {partner.id} ({spec.title})"
    partner = _looking(partner)
    delay = max(settings.delay, partner.request_delay / 1000)
    settings = CheckSettings(delay=delay, pause=settings.pause, max_requests=settings.max_requests)
    if spec.check is None:
        return Report(subject, endpoint.base_url, [Finding(
            INFO, "readiness check", f"no readiness check yet for {spec.title} partners: nothing was asked of the "
            "endpoint", "run its first harvest and read its run (partner-harvest status, report)")],
            0, settings, checked=False)
    remember(endpoint.password or "")  # whatever the protocol does with it, the report never shows it
    budget = RequestBudget(settings, sleep)
    findings: list[Finding] = []
    try:
        adapter = build_adapter(partner, endpoint, paced_by=budget)
    except HarvestError as exc:  # a Connection the harvest could not use either
        findings.append(Finding(FAIL, "configuration", exc.cause, "correct the Connection (or the flags given)",
                                "configuration"))
        return Report(subject, endpoint.base_url, findings, 0, settings)
    probe = Probe(partner, adapter, settings, sleep, findings)
    try:
        spec.check(probe)
    except BudgetSpent:
        probe.info("request budget", f"stopped after {budget.sent} requests (--max-requests); the probes after "
                   "this point were not run", "run again with a larger --max-requests", "budget-spent")
    except HarvestError as exc:  # a probe did not expect it: said in one line, the check ends
        probe.fail("endpoint", f"{type(exc).__name__}: {' '.join(exc.cause.split())} ({exc.request})",
                   "see the cause: the harvest would stop here too", "unexpected-answer")
    finally:
        session = getattr(getattr(adapter, "client", None), "session", None)  # its connections, closed
        if session is not None:
            session.close()
    return Report(subject, endpoint.base_url, findings, budget.sent, settings)


CHECK_RETRIES = 2  # a check looks, it does not harvest: what keeps failing is named after two retries
CHECK_BACKOFF_MAX = 10.0


def _looking(partner: Partner) -> Partner:
    """The partner as the check asks: its own HTTP policy, with at most two retries."""
    http = partner.options.http
    if http.retries <= CHECK_RETRIES and http.backoff_max <= CHECK_BACKOFF_MAX:
        return partner
    looking = http.model_copy(update={"retries": min(http.retries, CHECK_RETRIES),
                                      "backoff_max": min(http.backoff_max, CHECK_BACKOFF_MAX)})
    return partner.model_copy(update={"options": partner.options.model_copy(update={"http": looking})})


def one_line(text: str, limit: int = 200) -> str:
    """A cause or a body as one short line (the report's details)."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def listed(values: Iterable[str], limit: int = 5) -> str:
    """``a, b, c and 4 more``."""
    items = list(values)
    shown = ", ".join(items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")
