"""A report for one partner's own staff: its harvest history, what was
quarantined and what landed with warnings (by reason, with samples), and its completeness
proofs, as JSON or CSV.

It is meant to leave the house, so it holds only what is the partner's: every query is
bound to its ``partner_id``; no Connection, login, pool or other partner appears; the
endpoint named is the one the caller passes (the partner's own); any other URL or host in a
run's error or a check's detail (an aggregation database, a proxy, an internal host) is
replaced by ``[internal]``. Every section is capped. Plain psycopg, no Airflow: the CLI
(``partner-harvest report``) and the health page's report link both build it here.
"""

from __future__ import annotations

import csv
import io
import ipaddress
import re
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

import psycopg

from partner_harvest.registry import Partner

REPORT_VERSION = 1
DAYS = 90
MAX_RUNS = 500
SAMPLES = 5
MAX_REASONS = 100
INTERNAL = "[internal]"

CSV_COLUMNS = ("section", "run_id", "channel", "mode", "status", "started_at", "applied_at", "window_from",
               "window_until", "fetched", "upserted", "unchanged", "purged", "quarantined", "reason", "count",
               "identifier", "expected", "found", "ok", "detail")

_URL = re.compile(r"\b[a-z][a-z0-9+.-]*://[^\s'\"<>]+", re.IGNORECASE)
_HOST = re.compile(r"(?<![\w.@/-])(?:[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\.)+[a-z]{2,63}(?::\d+)?(?![\w-])",
                   re.IGNORECASE)
_IPV4 = re.compile(r"(?<![\d.])(?:\d{1,3}\.){3}\d{1,3}(?::\d+)?(?![\d.])")
# A host name ending in one of these is a file name or a format, not a host ("oai_dc.xsd").
_NOT_HOSTS = ("xsd", "xml", "json", "py", "txt", "html", "sql", "csv", "yaml", "yml", "gz", "marc", "mrc")


def endpoint_host(endpoint: str | None) -> str | None:
    try:
        return (urlsplit(endpoint).hostname or None) if endpoint else None
    except ValueError:
        return None


def public_endpoint(endpoint: str | None) -> str | None:
    """The endpoint as it may be shown: scheme, host, port and path; never user info or a query."""
    if not endpoint:
        return None
    try:
        parts = urlsplit(endpoint)
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return None
    return f"{parts.scheme}://{parts.hostname}{port}{parts.path}" if parts.hostname else None


def scrub(text: str | None, own_host: str | None) -> str | None:
    """``text`` with every URL, host name and IP address that is not the partner's own replaced."""
    if text is None:
        return None
    own = (own_host or "").lower()

    def url(match: re.Match[str]) -> str:
        found = match.group(0).rstrip(".,;:)")
        tail = match.group(0)[len(found):]
        host = endpoint_host(found) or ""
        if own and host.lower() == own:
            return (public_endpoint(found) or INTERNAL) + tail
        return INTERNAL + tail

    def host(match: re.Match[str]) -> str:
        name = match.group(0).split(":", 1)[0].lower()
        if name == own or name.rsplit(".", 1)[-1] in _NOT_HOSTS:
            return match.group(0)
        return INTERNAL

    def address(match: re.Match[str]) -> str:
        value = match.group(0).split(":", 1)[0]
        try:
            ipaddress.ip_address(value)
        except ValueError:
            return match.group(0)
        return match.group(0) if value == own else INTERNAL

    text = _URL.sub(url, text)
    text = _HOST.sub(host, text)
    return _IPV4.sub(address, text)


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def build_report(conn: psycopg.Connection, partner: Partner, now: datetime, *, endpoint: str | None = None,
                 days: int = DAYS, max_runs: int = MAX_RUNS, samples: int = SAMPLES) -> dict[str, Any]:
    """The report as a JSON-ready dict: the last ``days`` days up to ``now`` (aware UTC)."""
    since = now - timedelta(days=days)
    own = endpoint_host(endpoint)
    pid = partner.id
    runs = conn.execute(
        """
        SELECT run_id, channel, mode, status, started_at, applied_at, window_from, window_until, fetched, upserted,
               unchanged, purged, quarantined, warnings, error, records_held
        FROM harvest_runs WHERE partner_id = %s AND started_at >= %s
        ORDER BY started_at DESC, run_id, channel LIMIT %s
        """, (pid, since, max_runs)).fetchall()
    history = [{
        "run_id": run_id, "channel": channel, "mode": mode, "status": status, "started_at": _iso(started),
        "applied_at": _iso(applied), "window_from": _iso(wfrom), "window_until": _iso(wuntil), "fetched": fetched,
        "upserted": upserted, "unchanged": unchanged, "purged": purged, "quarantined": quarantined,
        "warnings": dict(warnings or {}), "records_held_after": held, "error": scrub(error, own),
    } for (run_id, channel, mode, status, started, applied, wfrom, wuntil, fetched, upserted, unchanged, purged,
           quarantined, warnings, error, held) in runs]

    reasons = conn.execute(
        """
        SELECT reason, count(*), count(DISTINCT identifier), min(quarantined_at), max(quarantined_at)
        FROM quarantine WHERE partner_id = %s AND quarantined_at >= %s
        GROUP BY reason ORDER BY count(*) DESC, reason LIMIT %s
        """, (pid, since, MAX_REASONS)).fetchall()
    open_now: dict[str, int] = dict(conn.execute(
        "SELECT reason, count(*) FROM quarantine_current WHERE partner_id = %s GROUP BY reason", (pid,)).fetchall())
    quarantine = []
    for reason, rejects, records, first, last in reasons:
        picked = conn.execute(
            """
            SELECT identifier, run_id, quarantined_at FROM quarantine
            WHERE partner_id = %s AND reason = %s AND quarantined_at >= %s
            ORDER BY quarantined_at DESC, id DESC LIMIT %s
            """, (pid, reason, since, samples)).fetchall()
        quarantine.append({
            "reason": scrub(reason, own), "rejects": rejects, "records": records, "still_quarantined": open_now.get(reason, 0),
            "first_at": _iso(first), "last_at": _iso(last),
            "samples": [{"identifier": i, "run_id": r, "at": _iso(at)} for i, r, at in picked],
        })

    checks = conn.execute(
        """
        SELECT w.key, sum(w.value::bigint) FROM harvest_runs h, jsonb_each_text(h.warnings) AS w
        WHERE h.partner_id = %s AND h.started_at >= %s AND h.status = 'applied'
        GROUP BY w.key ORDER BY sum(w.value::bigint) DESC, w.key LIMIT %s
        """, (pid, since, MAX_REASONS)).fetchall()
    warnings = []
    for check, landed in checks:
        picked = conn.execute(
            """
            SELECT identifier, warnings ->> %s, run_id FROM records
            WHERE partner_id = %s AND warnings ? %s ORDER BY harvested_at DESC LIMIT %s
            """, (check, pid, check, samples)).fetchall()
        warnings.append({"check": check, "records_landed": int(landed),
                         "samples": [{"identifier": i, "message": scrub(m, own), "run_id": r} for i, m, r in picked]})

    proofs = conn.execute(
        """
        SELECT run_id, channel, mode, started_at, check_kind, check_ok, check_expected, check_found, check_detail,
               complete_list_size, list_size_mismatch, fetched
        FROM harvest_runs
        WHERE partner_id = %s AND started_at >= %s AND (check_kind IS NOT NULL OR complete_list_size IS NOT NULL)
        ORDER BY started_at DESC, run_id, channel LIMIT %s
        """, (pid, since, max_runs)).fetchall()
    completeness = [{
        "run_id": run_id, "channel": channel, "mode": mode, "at": _iso(at),
        "check": kind or "oai-complete-list-size", "ok": ok if kind else not mismatch,
        "expected": expected if kind else size, "found": found if kind else fetched,
        "detail": scrub(detail, own),
    } for run_id, channel, mode, at, kind, ok, expected, found, detail, size, mismatch, fetched in proofs]
    reconciles = [r for r in history if r["channel"] == "reconcile"]
    held = conn.execute("SELECT records_held, quarantined_now FROM partner_stats WHERE partner_id = %s",
                        (pid,)).fetchone()
    conn.commit()
    return {
        "report_version": REPORT_VERSION,
        "partner": {"id": pid, "protocol": partner.protocol, "endpoint": public_endpoint(endpoint)},
        "period": {"from": _iso(since), "until": _iso(now), "days": days},
        "generated_at": _iso(now),
        "summary": {
            "records_held": held[0] if held else 0, "quarantined_now": held[1] if held else 0,
            "runs": len(history), "runs_failed": sum(1 for r in history if r["status"] in ("failed", "abandoned")),
            "reconciles": len(reconciles), "purged_by_reconciles": sum(r["purged"] for r in reconciles),
            "checks_failed": sum(1 for c in completeness if c["ok"] is False),
            "history_capped_at": max_runs if len(history) == max_runs else None,
        },
        "history": history,
        "quarantine": quarantine,
        "warnings": warnings,
        "completeness": completeness,
    }


def _cell(value: Any) -> str:
    """A CSV cell a spreadsheet shows as text: a leading = + - @ (a formula) is quoted away."""
    if value is None:
        return ""
    text = str(value)
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text


def report_rows(report: dict[str, Any]) -> Iterable[dict[str, Any]]:
    """The report flattened: one row per run, reason, sample and proof, told apart by ``section``."""
    for run in report["history"]:
        yield {"section": "run", **{k: v for k, v in run.items() if k in CSV_COLUMNS}, "detail": run["error"]}
    for q in report["quarantine"]:
        yield {"section": "quarantine", "reason": q["reason"], "count": q["rejects"],
               "detail": f"{q['records']} record(s), {q['still_quarantined']} still quarantined"}
        for s in q["samples"]:
            yield {"section": "quarantine_sample", "reason": q["reason"], "identifier": s["identifier"],
                   "run_id": s["run_id"], "started_at": s["at"]}
    for w in report["warnings"]:
        yield {"section": "warning", "reason": w["check"], "count": w["records_landed"]}
        for s in w["samples"]:
            yield {"section": "warning_sample", "reason": w["check"], "identifier": s["identifier"],
                   "run_id": s["run_id"], "detail": s["message"]}
    for c in report["completeness"]:
        yield {"section": "completeness", "run_id": c["run_id"], "channel": c["channel"], "mode": c["mode"],
               "started_at": c["at"], "reason": c["check"], "ok": c["ok"], "expected": c["expected"],
               "found": c["found"], "detail": c["detail"]}


def report_csv(report: dict[str, Any]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=CSV_COLUMNS, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in report_rows(report):
        writer.writerow({k: _cell(row.get(k)) for k in CSV_COLUMNS})
    return out.getvalue()
