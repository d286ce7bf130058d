"""Alerts: one Notifier, channels chosen by the deployment through Connections.

The code always attaches :class:`PartnerAlertNotifier`; what it sends depends on which
Connections exist:

- ``harvest_alerts_smtp`` (type smtp): an email; ``extra.to`` lists the recipients,
  ``extra.from_email`` the sender.
- ``harvest_alerts_apprise`` (type apprise, the ``apache-airflow-providers-apprise``
  provider): chat tools and anything else Apprise speaks (``slack://``, ``msteams://``/
  ``workflows://``, ``matrix://``, ``mailto://``, ``json://``...); ``extra.config`` holds
  ``{"path": "<apprise URL>"}`` or a list of them. Apprise formats each service's message.
- ``harvest_alerts_webhook`` (type http): a generic JSON POST to its host (a full URL; a
  password, if set, is sent as a bearer token), for machines: the body carries the fields
  as ``harvest`` (and a ``text`` line, which a Slack incoming webhook also accepts).

Any of them, several or none: with none defined, an alert is only logged.
"""

from __future__ import annotations

import html
import logging
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from typing import Any

import requests
from airflow.sdk import BaseHook, BaseNotifier, Connection, Context

from partner_harvest import durations, failures

log = logging.getLogger(__name__)

SMTP_CONN_ID = "harvest_alerts_smtp"
WEBHOOK_CONN_ID = "harvest_alerts_webhook"
APPRISE_CONN_ID = "harvest_alerts_apprise"


def one_line(value: object, limit: int = 400) -> str:
    text = " ".join(str(value).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


# A try that ended without an exception reaching Airflow: its process was killed (out of
# memory, a worker lost) or stopped heartbeating; Airflow runs the callback for it.
NO_ERROR = "no error reached Airflow: the task's process was killed or lost (see the task's log)"


def failure_fields(context: Mapping[str, Any], partner_id: str) -> dict[str, Any]:
    """What an operator needs to act: partner, DAG, task, the attempt, window, the cause in a
    few words and in full (``failures.classify``, as the task wrapper decided), log link."""
    ti = context.get("ti") or context.get("task_instance")
    dag_id = getattr(ti, "dag_id", None) or getattr(context.get("dag"), "dag_id", "?")
    window = None
    try:
        window = ti.xcom_pull(task_ids="freeze_window") if ti is not None else None
    except Exception:  # the window is a courtesy; the alert must go out without it
        window = None
    if isinstance(window, dict) and window.get("until"):
        window_text = f"{window.get('mode')} {window.get('from') or 'beginning'} .. {window['until']}"
    else:
        window_text = "not frozen yet"
    exception = context.get("exception")
    failure = failures.classify(exception) if isinstance(exception, BaseException) else None
    try_number = getattr(ti, "try_number", None)
    max_tries = getattr(ti, "max_tries", None)
    return {
        "partner": partner_id,
        "dag_id": dag_id,
        "task_id": getattr(ti, "task_id", "?"),
        "try_number": try_number,
        # A cleared task's max_tries grows with its try number: "attempt 5 of 8" stays true.
        "attempts": max_tries + 1 if isinstance(max_tries, int) else None,
        "run_id": getattr(context.get("dag_run"), "run_id", None) or getattr(ti, "run_id", None),
        "window": window_text,
        "cause": failure.short if failure else (str(exception) if exception is not None else NO_ERROR),
        "details": failure.full if failure else None,
        "rule": failure.rule if failure else None,
        "log_url": getattr(ti, "log_url", None),
    }


def next_try(context: Mapping[str, Any], now: datetime | None = None) -> str:
    """When Airflow runs the next try of a task that just failed one: its retry delay, grown
    exponentially, as a range (Airflow picks a point in it per task instance)."""
    ti = context.get("ti") or context.get("task_instance")
    task = getattr(ti, "task", None)
    delay, try_number = getattr(task, "retry_delay", None), getattr(ti, "try_number", None)
    if not isinstance(delay, timedelta) or not isinstance(try_number, int):
        return "next try after the task's retry_delay"
    low, high = failures.retry_wait(delay, float(getattr(task, "retry_exponential_backoff", 0) or 0),
                                    getattr(task, "max_retry_delay", None), try_number)
    at = (now or datetime.now(timezone.utc)) + high
    span = durations.human(low) if low == high else f"{durations.human(low)}–{durations.human(high)}"
    return f"next try in {span} (by {at:%H:%M}Z)"


def attempt_text(fields: Mapping[str, Any]) -> str:
    if fields.get("try_number") is None:
        return "attempt ?"
    return f"attempt {fields['try_number']}" + (f" of {fields['attempts']}" if fields.get("attempts") else "")


def event_message(fields: Mapping[str, Any], outcome: str) -> str:
    """``run_events.message``: the short cause and the task first (what the index and ``status``
    show: the first line), the full text after it (the partner page)."""
    first = f"{fields['cause']} ({fields['task_id']}, {attempt_text(fields)} {outcome})"
    return first + (f"\n{fields['details']}" if fields.get("details") and fields["details"] != fields["cause"] else "")


class PartnerAlertNotifier(BaseNotifier):
    """A task's failure alert naming the partner (given by the DAG factory, which built the DAG
    for it); sent through the deployment's channels. ``retrying``: the alert of a failed try
    that Airflow will run again ("retrying, attempt n of m, next try in ..."), else the final
    failure's. Folded per endpoint host and cause (alert_digest.py)."""

    def __init__(self, partner_id: str, smtp_conn_id: str = SMTP_CONN_ID, webhook_conn_id: str = WEBHOOK_CONN_ID,
                 conn_id: str | None = None, retrying: bool = False):
        super().__init__()
        self.partner_id = partner_id
        self.smtp_conn_id = smtp_conn_id
        self.webhook_conn_id = webhook_conn_id
        self.conn_id = conn_id  # the partner's Connection: its host groups a shared outage (alert_digest.py)
        self.retrying = retrying

    def notify(self, context: Context) -> None:
        fields = failure_fields(context, self.partner_id)
        where = f"{fields['partner']}: {fields['dag_id']}.{fields['task_id']}"
        if self.retrying:
            then = next_try(context)
            subject = f"[partner harvest] {where} retrying: {fields['cause']} ({attempt_text(fields)} failed)"
            verdict = f"Retrying: {attempt_text(fields)} failed; {then}. Nothing to do yet."
            fields = {**fields, "kind": "retrying", "next_try": then}
        else:
            subject = f"[partner harvest] {where} failed: {fields['cause']}"
            verdict = final_verdict(fields)
            fields = {**fields, "kind": "failure"}
        lines = [
            f"Partner: {fields['partner']}",
            f"DAG: {fields['dag_id']}   run: {fields['run_id']}",
            f"Task: {fields['task_id']}   {attempt_text(fields)}",
            f"Window: {fields['window']}",
            f"Cause: {fields['cause']}",
            verdict,
            *([f"Details: {fields['details']}"] if fields.get("details") and fields["details"] != fields["cause"] else []),
            f"Log: {fields['log_url']}",
        ]
        from partner_harvest.airflow.alert_digest import alert_failure, partner_host

        kind = fields["rule"] or type(context.get("exception")).__name__
        alert_failure(fields, subject, lines, host=partner_host(self.conn_id),
                      error_type=f"retrying: {kind}" if self.retrying else kind,
                      send=lambda subject, lines, fields: send_alert(subject, lines, fields, self.smtp_conn_id,
                                                                     self.webhook_conn_id))


def failed_at_once(fields: Mapping[str, Any]) -> bool:
    """A final failure with tries left: the task wrapper decided no retry can fix it."""
    tries, attempts = fields.get("try_number"), fields.get("attempts")
    return isinstance(tries, int) and isinstance(attempts, int) and tries < attempts


def final_verdict(fields: Mapping[str, Any]) -> str:
    """The final failure's line: failed at once (no retry can fix it), or after its last try."""
    if failed_at_once(fields):
        rule = fields.get("rule")
        return (f"Failed at once on {attempt_text(fields)}: no retry can fix this"
                f"{f' ({rule})' if rule and rule != failures.OTHER.name else ''}. Fix the cause, then clear the task.")
    return f"Final: {attempt_text(fields)} failed, no retry left. Clear the task once the cause is fixed."


def run_overdue_alert(
    partner_id: str, dag_id: str, pool: str, run_deadline: str, context: dict[str, Any] | None = None
) -> list[str]:
    """Deadline callback (executor): a run has not finished ``run_deadline`` after its
    logical date (a nightly run's cron tick). The usual cause is a missing pool (Airflow
    never schedules its tasks, and only the scheduler's log says so), else a stuck task or a
    very slow partner."""
    context = context or {}
    dag_run = context.get("dag_run") or {}
    run_id = dag_run.get("dag_run_id") or dag_run.get("run_id") or "?"
    if dag_run.get("state") in ("success", "failed"):
        # Airflow prunes a run's deadlines only on success; a failed run was already
        # alerted by its task's failure notifier.
        log.info("%s: run %s of %s is %s; no overdue alert", partner_id, run_id, dag_id, dag_run["state"])
        return []
    due, queued = _instant((context.get("deadline") or {}).get("deadline_time")), _instant(dag_run.get("queued_at"))
    if due is not None and queued is not None and queued >= due:
        # A backfill's day or a manual run dated in the past: its deadline had passed when it
        # was queued; its tasks' own failures alert.
        log.info("%s: run %s of %s was queued at %s, after its run deadline %s; no overdue alert",
                 partner_id, run_id, dag_id, queued.isoformat(), due.isoformat())
        return []
    subject = (f"[partner harvest] {partner_id}: {dag_id} run {run_id} not finished {run_deadline} "
               "after its logical date")
    lines = [
        f"Partner: {partner_id}",
        f"DAG: {dag_id}   run: {run_id}   state: {dag_run.get('state', '?')}",
        f"Logical date: {dag_run.get('logical_date', '?')}   queued at: {dag_run.get('queued_at', '?')}   "
        f"deadline: {run_deadline}",
        f"Check first that the pool {pool} exists (Admin > Pools): Airflow never schedules a task "
        "whose pool is missing. Create it with `partner-harvest sync-pools`.",
        "Otherwise a task is stuck or the partner is very slow: see the run's tasks in the UI.",
    ]
    fields = {"kind": "overdue", "partner": partner_id, "dag_id": dag_id, "run_id": run_id,
              "pool": pool, "run_deadline": run_deadline}
    return send_alert(subject, lines, fields)


def run_late_alert(
    partner_id: str, dag_id: str, finish_by: str, context: dict[str, Any] | None = None
) -> list[str]:
    """Deadline callback (executor): a scheduled run is still unfinished at the registry's
    ``finish_by`` (UTC), e.g. the nightly harvest the morning's users rely on."""
    context = context or {}
    dag_run = context.get("dag_run") or {}
    run_id = dag_run.get("dag_run_id") or dag_run.get("run_id") or "?"
    if dag_run.get("run_type") not in (None, "scheduled"):
        # Only the nightly runs are due by a time of day; manual runs have run_deadline.
        log.info("%s: run %s of %s is %s; finish_by applies to scheduled runs only",
                 partner_id, run_id, dag_id, dag_run.get("run_type"))
        return []
    if dag_run.get("state") in ("success", "failed"):
        log.info("%s: run %s of %s is %s; no late alert", partner_id, run_id, dag_id, dag_run["state"])
        return []
    due, queued = _instant((context.get("deadline") or {}).get("deadline_time")), _instant(dag_run.get("queued_at"))
    if due is not None and queued is not None and queued >= due:
        # Unpausing (catchup=False) creates the latest tick's run at once: already past its
        # finish_by when it was queued, it could never have made it. Not a late night.
        log.info("%s: run %s of %s was queued at %s, after its finish_by deadline %s; no late alert",
                 partner_id, run_id, dag_id, queued.isoformat(), due.isoformat())
        return []
    subject = f"[partner harvest] {partner_id}: {dag_id} run {run_id} not finished by {finish_by} UTC"
    lines = [
        f"Partner: {partner_id}",
        f"DAG: {dag_id}   run: {run_id}   state: {dag_run.get('state', '?')}",
        f"Started at: {dag_run.get('start_date') or 'not yet'}   due by: {finish_by} UTC (registry finish_by)",
        "The run goes on; today's changes are not in the aggregation yet. See the run's tasks in the UI: "
        "a task waiting for retries (the partner is down or slow), a missing pool, or a large window.",
    ]
    fields = {"kind": "late", "partner": partner_id, "dag_id": dag_id, "run_id": run_id, "finish_by": finish_by}
    return send_alert(subject, lines, fields)


def _instant(value: Any) -> datetime | None:
    """A datetime from the callback context (a datetime, or ISO text once serialized)."""
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=timezone.utc)
    if isinstance(value, str) and value:
        try:
            return _instant(datetime.fromisoformat(value.replace("Z", "+00:00")))
        except ValueError:
            return None
    return None


def send_alert(
    subject: str,
    lines: Iterable[str],
    fields: dict[str, Any],
    smtp_conn_id: str = SMTP_CONN_ID,
    webhook_conn_id: str = WEBHOOK_CONN_ID,
    apprise_conn_id: str = APPRISE_CONN_ID,
) -> list[str]:
    """Send through every configured channel; a broken channel is logged, never raised."""
    lines = list(lines)
    log.warning("ALERT %s | %s", subject, " | ".join(lines))
    sent = []
    channels = (("email", smtp_conn_id, _send_email), ("webhook", webhook_conn_id, _send_webhook),
                ("apprise", apprise_conn_id, _send_apprise))
    for name, conn_id, sender in channels:
        conn = _connection(conn_id)
        if conn is None:
            continue
        try:
            sender(conn_id, conn, subject, lines, fields)
            sent.append(name)
        except Exception as exc:  # an alert channel failing must not hide the original failure
            cause = redact(one_line(f"{type(exc).__name__}: {exc}"), _secrets_of(conn))
            log.error("could not send the %s alert through Connection %s: %s", name, conn_id, cause)
    return sent


def _connection(conn_id: str) -> Connection | None:
    try:
        return BaseHook.get_connection(conn_id)
    except Exception:
        return None


def _send_email(conn_id: str, conn: Any, subject: str, lines: list[str], fields: dict[str, Any]) -> None:
    from airflow.providers.smtp.hooks.smtp import SmtpHook

    extra = conn.extra_dejson
    to = extra.get("to")
    if not to:
        raise ValueError(f"Connection {conn_id} has no extra 'to' (the alert recipients)")
    body = "<br>\n".join(html.escape(line) for line in lines)
    with SmtpHook(smtp_conn_id=conn_id) as hook:
        hook.send_email_smtp(to=to, subject=subject, html_content=body, from_email=extra.get("from_email"))


class AlertChannelError(RuntimeError):
    """A channel could not deliver; the message never holds the webhook URL or a password."""


def _send_webhook(conn_id: str, conn: Any, subject: str, lines: list[str], fields: dict[str, Any]) -> None:
    """POST the alert. The URL is itself a credential (Slack-style webhooks carry their
    token in the path), and requests' errors quote it: only the status or the exception
    type leaves this function."""
    url = (conn.host or "").strip()
    if "://" not in url:
        url = f"{conn.schema or 'https'}://{url}{':' + str(conn.port) if conn.port else ''}"
    headers = {"Content-Type": "application/json"}
    if conn.password:
        headers["Authorization"] = f"Bearer {conn.password}"
    payload = {"text": subject + "\n" + "\n".join(lines), "harvest": fields}
    try:
        response = requests.post(url, json=payload, headers=headers, timeout=15)
    except requests.RequestException as exc:
        raise AlertChannelError(f"webhook of Connection {conn_id} unreachable ({type(exc).__name__})") from None
    if response.status_code >= 400:
        raise AlertChannelError(f"webhook of Connection {conn_id} answered HTTP {response.status_code}")


def _apprise_urls(conn: Any) -> list[str]:
    """The Apprise URLs of the Connection's ``config`` extra (a dict, a list, or JSON of either)."""
    import json

    try:
        config = (getattr(conn, "extra_dejson", None) or {}).get("config")
        config = json.loads(config) if isinstance(config, str) else config
    except ValueError:
        return []
    entries = config if isinstance(config, list) else [config] if isinstance(config, dict) else []
    return [str(entry["path"]) for entry in entries if isinstance(entry, dict) and entry.get("path")]


def _send_apprise(conn_id: str, conn: Any, subject: str, lines: list[str], fields: dict[str, Any]) -> None:
    """Through the Apprise provider's hook (its Connection format); Apprise's own result
    decides, since the hook ignores it. Apprise URLs carry tokens: its log lines are redacted."""
    import apprise
    from airflow.providers.apprise.hooks.apprise import AppriseHook

    urls = _apprise_urls(conn)
    sender = apprise.Apprise()
    urgent = fields.get("kind") in ("failure", "overdue", "late")
    with _redacted("apprise", _secrets_of(conn)):  # Apprise logs each URL it loads and posts to
        try:
            AppriseHook(apprise_conn_id=conn_id).set_config_from_conn(conn=conn, apprise_obj=sender)
        except (KeyError, ValueError, TypeError) as exc:
            raise AlertChannelError(f"Connection {conn_id} has no usable extra 'config' ({type(exc).__name__})") from None
        if len(sender) == 0 or len(sender) < len(urls):
            raise AlertChannelError(f"Connection {conn_id}: {max(len(urls) - len(sender), 1)} of {len(urls)} "
                                    "Apprise URL(s) not understood by Apprise (check the scheme)")
        result = sender.notify(
            title=subject, body="\n".join(lines), body_format=apprise.NotifyFormat.TEXT,
            notify_type=apprise.NotifyType.FAILURE if urgent else apprise.NotifyType.WARNING,
        )
    if not result:
        raise AlertChannelError(f"Apprise (Connection {conn_id}) could not deliver to every service "
                                f"({len(sender)} configured; Apprise's log says which host)")


class _Redact(logging.Filter):
    def __init__(self, secrets: list[str]) -> None:
        super().__init__()
        self.secrets = secrets

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        cleaned = redact(message, self.secrets)
        if cleaned != message:
            record.msg, record.args = cleaned, ()
        return True


@contextmanager
def _redacted(logger_name: str, secrets: list[str]) -> Iterator[None]:
    """Redact ``secrets`` from a library's log records (at every level) while it sends."""
    logger = logging.getLogger(logger_name)
    flt = _Redact(secrets)
    logger.addFilter(flt)
    try:
        yield
    finally:
        logger.removeFilter(flt)


def _secrets_of(conn: Any) -> list[str]:
    """Strings of a Connection that must never reach a log line (longest first)."""
    values = {str(v).strip() for v in (getattr(conn, "host", None), getattr(conn, "password", None),
                                       *_apprise_urls(conn)) if v}
    for value in list(values):
        if "://" in value:  # the path of a webhook URL carries its token
            values.add(value.split("://", 1)[1])
            path = value.split("://", 1)[1].partition("/")[2]
            if path:
                values.update({"/" + path, "/" + path.partition("?")[0]})
            values.update(_url_tokens(value))
    return sorted((v for v in values if len(v) >= 4), key=len, reverse=True)


def _url_tokens(url: str) -> set[str]:
    """Token-like pieces of a URL (user info, path segments, query values of 8+ characters):
    a service may log them one by one (Apprise's Slack URL is three tokens). Not the host."""
    from urllib.parse import parse_qsl, urlsplit

    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
    except ValueError:
        return set()
    userinfo = parts.netloc.rpartition("@")[0]
    pieces = [*userinfo.split(":"), *parts.path.split("/"), *(v for _, v in parse_qsl(parts.query))]
    return {piece for piece in pieces if len(piece) >= 8 and piece.lower() != host.lower()}


def redact(text: str, secrets: Iterable[str]) -> str:
    for secret in secrets:
        text = text.replace(secret, "***")
    return text
