"""Data-quality findings on a successful run: things a person should look at.

A run can succeed and still be wrong: a partner that starts sending broken records (or odd
ones that land with a warning), that deletes a large share of its collection, or that has
gone silent for longer than usual.
"""

from __future__ import annotations

from datetime import datetime

from partner_harvest.registry import Partner
from partner_harvest.store.quality import RunFigures

MIN_FETCHED_FOR_RATE = 20  # a handful of records is no basis for a rate


def findings(partner: Partner, figures: RunFigures, now: datetime) -> list[str]:
    """One line per threshold crossed; empty when the run looks healthy."""
    found: list[str] = []
    if figures.fetched >= MIN_FETCHED_FOR_RATE:
        rate = figures.quarantined / figures.fetched
        if rate > partner.quarantine_alert_rate:
            found.append(
                f"quarantine rate {rate:.1%} ({figures.quarantined} of {figures.fetched} fetched) is over "
                f"{partner.quarantine_alert_rate:.0%}: see the quarantine table for the reasons"
            )
    found.extend(_new_warnings(partner, figures))
    before = figures.held + figures.purged
    # A purge a person approved at the run's approval gate is not news to anyone.
    if before and figures.purged / before > partner.purge_alert_fraction and not figures.purge_approved:
        found.append(
            f"purge spike: {figures.purged} of {before} records ({figures.purged / before:.1%}) removed in one run, "
            f"over {partner.purge_alert_fraction:.0%}"
        )
    if figures.announced is not None:
        found.append(
            f"the partner announced completeListSize={figures.announced} but {figures.fetched} items came: "
            "records may be missing (a reconcile will tell)"
        )
    for check in figures.failed_checks:
        found.append(f"completeness check failed: {check}; records may be missing or extra (see "
                     "docs/operator/operating.md, 'Completeness checks')")
    reference = figures.last_fetch_at or figures.first_run_at
    if reference is not None and is_quiet(partner, figures.last_fetch_at, figures.first_run_at, now):
        since = figures.last_fetch_at.strftime("%Y-%m-%d %H:%MZ") if figures.last_fetch_at else "never"
        found.append(
            f"no record fetched for {(now - reference).days} days (last fetch: {since}); "
            f"the expected quiet period is {partner.quiet_period.days} days: is the partner still publishing?"
        )
    return found


def _new_warnings(partner: Partner, figures: RunFigures) -> list[str]:
    """A validation check that warned on more than the quarantine alert rate of the fetched
    records and not on the previous run: the partner started sending such records. The records
    landed; a check that always warns for a partner is its normal and is not repeated nightly."""
    if figures.fetched < MIN_FETCHED_FOR_RATE:
        return []
    found = []
    for check, n in sorted(figures.warnings.items(), key=lambda item: (-item[1], item[0])):
        rate = n / figures.fetched
        if rate > partner.quarantine_alert_rate and (figures.previous_warnings is None
                                                     or check not in figures.previous_warnings):
            found.append(
                f"new warning {check} on {n} of {figures.fetched} fetched records ({rate:.1%}), not seen in the "
                f"previous run: the records landed with it (records.warnings); registry options.validation "
                f"can make it a reject (docs/operator/validation.md)"
            )
    return found


def is_quiet(partner: Partner, last_fetch_at: datetime | None, first_run_at: datetime | None, now: datetime) -> bool:
    """No record fetched (since the first run, if none ever was) for longer than ``quiet_period``."""
    reference = last_fetch_at or first_run_at
    return reference is not None and now - reference > partner.quiet_period
