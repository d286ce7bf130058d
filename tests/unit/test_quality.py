"""Data-quality findings: thresholds crossed on a successful run."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

from partner_harvest.quality import findings
from partner_harvest.store.quality import RunFigures
from tests.support.partners import oai_partner

NOW = datetime(2026, 6, 1, tzinfo=timezone.utc)
PARTNER = oai_partner("p", quarantine_alert_rate=0.05, purge_alert_fraction=0.05, quiet_period=timedelta(days=7))


def figures(**kw: Any) -> RunFigures:
    base: dict[str, Any] = dict(fetched=100, purged=0, quarantined=0, held=1000, last_fetch_at=NOW, first_run_at=NOW - timedelta(days=30))
    base.update(kw)
    return RunFigures(**base)


def test_healthy_run_has_no_findings() -> None:
    assert findings(PARTNER, figures(quarantined=5, purged=50), NOW) == []


def test_quarantine_rate_over_threshold() -> None:
    [line] = findings(PARTNER, figures(quarantined=6), NOW)
    assert line.startswith("quarantine rate 6.0% (6 of 100 fetched)")
    assert findings(PARTNER, figures(fetched=10, quarantined=5), NOW) == []  # too few to judge


def test_purge_spike() -> None:
    [line] = findings(PARTNER, figures(purged=60, held=940), NOW)
    assert line.startswith("purge spike: 60 of 1000 records (6.0%)")


def test_quiet_partner() -> None:
    [line] = findings(PARTNER, figures(fetched=0, last_fetch_at=NOW - timedelta(days=9)), NOW)
    assert line.startswith("no record fetched for 9 days")
    assert findings(PARTNER, figures(fetched=0, last_fetch_at=NOW - timedelta(days=6)), NOW) == []
    [never] = findings(PARTNER, figures(fetched=0, last_fetch_at=None, first_run_at=NOW - timedelta(days=8)), NOW)
    assert "last fetch: never" in never


def test_list_size_mismatch() -> None:
    [line] = findings(PARTNER, figures(announced=120), NOW)
    assert line.startswith("the partner announced completeListSize=120 but 100 items came")


def test_a_failed_completeness_check_is_a_finding() -> None:
    check = "sierra-id-enumeration on the changes channel: the witness says 100, the run holds 98"
    [line] = findings(PARTNER, figures(failed_checks=(check,)), NOW)
    assert line.startswith("completeness check failed: sierra-id-enumeration") and "98" in line


def test_a_warning_a_partner_starts_sending_is_a_finding_once() -> None:
    """Records that land with a warning are usable: only a check newly over the rate is reported."""
    [line] = findings(PARTNER, figures(warnings={"marc.no_001": 40, "marc.leader_rebuilt": 2},
                                       previous_warnings=frozenset()), NOW)
    assert line.startswith("new warning marc.no_001 on 40 of 100 fetched records (40.0%)")
    assert findings(PARTNER, figures(warnings={"marc.no_001": 40}, previous_warnings=frozenset({"marc.no_001"})),
                    NOW) == []  # the partner's normal: not repeated nightly
    assert findings(PARTNER, figures(warnings={"marc.no_001": 5}, previous_warnings=None), NOW) == []  # under the rate
    assert len(findings(PARTNER, figures(warnings={"marc.no_001": 40}, previous_warnings=None), NOW)) == 1  # first run
