"""The partner health pages: a FastAPI app the api-server mounts (see ``airflow/plugin.py``).

Every route requires a user of Airflow's configured auth manager (the JWT cookie the UI
sets at login); a browser without one is sent to the auth manager's login page and back.
Figures come from the aggregation database through the ``aggregation_db`` Connection
(``store.health``); the partners from the registry the DAGs are built from.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from urllib.parse import quote, urlsplit

from fastapi import Depends, FastAPI, Form, HTTPException, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import Markup

from partner_harvest import durations
from partner_harvest.airflow.health import source
from partner_harvest.airflow.health.chart import runs_chart
from partner_harvest.failures import shorten
from partner_harvest.health_index import IndexQuery, partners_to_read, select_page
from partner_harvest.partner_state import slug
from partner_harvest.registry import Partner, Registry
from partner_harvest.report import build_report, report_csv
from partner_harvest.rollback import roll_back
from partner_harvest.store.content import state as content_state
from partner_harvest.store.health import (
    INVALID,
    STATES,
    PartnerHealth,
    channel_rows,
    index_health,
    partner_health,
    quarantine_today,
    recent_runs,
    warnings_today,
)
from partner_harvest.store.history import RollbackRefused, plan_rollback, rollback_points
from partner_harvest.store.history import rollbacks as history_rollbacks
from partner_harvest.store.pacing import partner_rate
from partner_harvest.store.progress import current_progress, summary_line

log = logging.getLogger(__name__)

URL_PREFIX = "/partner-health"
_templates = Environment(
    loader=FileSystemLoader(Path(__file__).with_name("templates")),
    autoescape=select_autoescape(["html"]),
)


def _require_user() -> Callable[..., Any]:
    """Airflow's own check: an authenticated user allowed to see the website."""
    from airflow.api_fastapi.auth.managers.models.resource_details import AccessView
    from airflow.api_fastapi.core_api.security import requires_access_view

    return requires_access_view(AccessView.WEBSITE)


def create_app() -> FastAPI:
    from airflow.api_fastapi.core_api.security import get_user

    app = FastAPI(title="Partner health", docs_url=None, redoc_url=None, openapi_url=None)
    guard = [Depends(_require_user())]
    current_user = Depends(get_user)  # who confirms a rollback

    @app.exception_handler(HTTPException)
    async def to_login(request: Request, exc: HTTPException) -> Response:
        """Not logged in: to the auth manager's login page, then back here."""
        if exc.status_code == 401 and "text/html" in request.headers.get("accept", ""):
            from airflow.api_fastapi.app import get_auth_manager

            return RedirectResponse(get_auth_manager().get_url_login(next_url=str(request.url)), status_code=303)
        return HTMLResponse(f"<p>{exc.status_code}: {exc.detail}</p>", status_code=exc.status_code)

    @app.get("/", response_class=HTMLResponse, dependencies=guard)
    def index(request: Request) -> HTMLResponse:
        """One page of the partners, filtered and sorted as the URL asks (health_index.py)."""
        query = IndexQuery.from_params(request.query_params)
        registry = source.registry()
        now, rows = _index_rows(registry, query)
        page = select_page(rows, query, total=len(registry.partners) + len(registry.errors))
        protocols = sorted({p.protocol for p in registry.partners})
        return _render("index.html", request, rows=_shown(registry, page.rows, now), index=page, counts=page.counts,
                       now=now, states=STATES, protocols=protocols)

    @app.get("/partner/{partner_id}", response_class=HTMLResponse, dependencies=guard)
    def partner(request: Request, partner_id: str) -> HTMLResponse:
        now = datetime.now(timezone.utc)
        registry = source.registry()
        entry = next((p for p in registry.partners if p.id == partner_id), None)
        if entry is None:
            raise HTTPException(404, f"partner {partner_id!r} is not in the registry {registry.path}")
        scheduled = source.latest_harvest_runs([entry])
        with source.connection() as conn:
            (health,) = partner_health(conn, [entry], now, scheduled)
            runs = recent_runs(conn, partner_id, limit=90)
            reasons, entries = quarantine_today(conn, partner_id, now)
            warned = warnings_today(conn, partner_id, now)
            progress = current_progress(conn, partner_id, unfinished=True)  # a run going on now, slice by slice
            rate = partner_rate(conn, partner_id)  # politeness at its endpoint host
            trust = content_state(conn, partner_id)  # the content check: datestamps unreliable?
            points = rollback_points(conn, partner_id)
            undone = history_rollbacks(conn, partner_id, limit=5)
            channels = channel_rows(conn, entry)  # each channel's cursor, newest counts, rows held
        return _render("partner.html", request, h=health, runs=runs, chart=Markup(runs_chart(runs)),
                       trust=trust, points=points, rollbacks=undone, retention=entry.history_retention,
                       reasons=reasons, entries=entries, warned=warned, now=now, progress=progress, rate=rate,
                       channels=channels if len(channels) > 1 else [],
                       progress_line=summary_line(progress) if progress else None,
                       progress_run=_audit_run(progress.run_id) if progress else None)

    @app.get("/partner/{partner_id}/rollback", response_class=HTMLResponse, dependencies=guard)
    def rollback_page(request: Request, partner_id: str, to_before: str) -> HTMLResponse:
        """What rolling the partner back to before a run would do, and the form that confirms it."""
        entry = _entry(partner_id)
        with source.connection() as conn:
            try:
                plan = plan_rollback(conn, partner_id, to_before)
            except RollbackRefused as exc:
                return _render("rollback.html", request, partner=entry, plan=None, error=exc.cause, done=None)
        return _render("rollback.html", request, partner=entry, plan=plan, error=None, done=None)

    @app.post("/partner/{partner_id}/rollback", response_class=HTMLResponse, dependencies=guard)
    def rollback_confirmed(request: Request, partner_id: str, user: Any = current_user, to_before: str = Form(...),
                           undone: str = Form(...), confirm: str = Form("")) -> HTMLResponse:
        """A person's confirmation: the partner id typed back, the plan they saw unchanged."""
        entry = _entry(partner_id)
        origin = request.headers.get("origin")
        if origin and urlsplit(origin).netloc != request.url.netloc:
            raise HTTPException(403, "a rollback is confirmed from the partner's own health page")
        if not source.may_edit_dag(user, entry.dag_id):
            raise HTTPException(403, f"you may not change {entry.dag_id}: a rollback pauses the partner's DAGs")
        with source.connection() as conn:
            try:
                plan = plan_rollback(conn, partner_id, to_before)
                if confirm.strip() != partner_id:
                    return _render("rollback.html", request, partner=entry, plan=plan, done=None,
                                   error="type the partner id to confirm; nothing changed")
                if ",".join(plan.undone_runs) != undone:
                    return _render("rollback.html", request, partner=entry, plan=plan, done=None,
                                   error="the partner changed since this page was shown; nothing changed: check again")
                done = roll_back(conn, entry, to_before, source.ServerSide(), requested_by=user.get_name(),
                                 via="health page", expected=plan)
            except RollbackRefused as exc:
                return _render("rollback.html", request, partner=entry, plan=None, error=exc.cause, done=None)
        return _render("rollback.html", request, partner=entry, plan=plan, error=None, done=done.lines())

    @app.get("/partner/{partner_id}/report.{fmt}", dependencies=guard)
    def report(partner_id: str, fmt: str) -> Response:
        """The partner-facing report (report.py) as a download, JSON or CSV."""
        if fmt not in ("json", "csv"):
            raise HTTPException(404, f"no report format {fmt!r} (json or csv)")
        registry = source.registry()
        entry = next((p for p in registry.partners if p.id == partner_id), None)
        if entry is None:
            raise HTTPException(404, f"partner {partner_id!r} is not in the registry {registry.path}")
        now = datetime.now(timezone.utc)
        with source.connection() as conn:
            built = build_report(conn, entry, now, endpoint=source.partner_base_url(entry.conn_id))
        name = f"partner-report-{partner_id}-{now:%Y%m%d}.{fmt}"
        headers = {"Content-Disposition": f'attachment; filename="{name}"'}
        if fmt == "csv":
            return Response(report_csv(built), media_type="text/csv; charset=utf-8", headers=headers)
        return JSONResponse(built, headers=headers)

    return app


# The figures of every partner behind one index request, kept a few seconds: at thousands of
# partners reading them is what a page costs, and an operator turning pages, sorting and
# filtering asks for the same figures again and again. "as of" on the page says how old.
# A small registry is read fresh on every request (it costs milliseconds).
INDEX_ROWS_FOR = timedelta(seconds=30)
CACHE_FROM_PARTNERS = 1000
_index_cache: dict[tuple[int, str | None], tuple[datetime, list[PartnerHealth]]] = {}
_index_lock = threading.Lock()


def _entry(partner_id: str) -> Partner:
    registry = source.registry()
    entry = next((p for p in registry.partners if p.id == partner_id), None)
    if entry is None:
        raise HTTPException(404, f"partner {partner_id!r} is not in the registry {registry.path}")
    return entry


def _index_rows(registry: Registry, query: IndexQuery) -> tuple[datetime, list[PartnerHealth]]:
    key = (id(registry), query.protocol)  # a changed registry file is a new Registry object (source.registry)
    now = datetime.now(timezone.utc)
    with _index_lock:
        cached = _index_cache.get(key)
        if cached is not None and now - cached[0] < INDEX_ROWS_FOR:
            return cached
    cache = len(registry.partners) >= CACHE_FROM_PARTNERS
    partners = partners_to_read(registry.partners, query)
    scheduled = source.latest_harvest_runs(partners)
    with source.connection() as conn:
        rows = index_health(conn, partners, now, scheduled, registry.errors if query.protocol is None else ())
    if not cache:
        return now, rows
    with _index_lock:
        for stale in [k for k, (at, _) in _index_cache.items() if now - at >= INDEX_ROWS_FOR or k[0] != key[0]]:
            del _index_cache[stale]
        _index_cache[key] = (now, rows)
    return now, rows


def _shown(registry: Registry, rows: list[PartnerHealth], now: datetime) -> list[PartnerHealth]:
    """The page's rows as the partner's own page shows them (partner_health, read for these
    partners only), in the index's order; an invalid entry's row as it is."""
    by_id = {p.id: p for p in registry.partners}
    partners = [by_id[h.partner_id] for h in rows if h.state != INVALID and h.partner_id in by_id]
    if not partners:
        return rows
    with source.connection() as conn:
        full = {h.partner_id: h for h in partner_health(conn, partners, now, source.latest_harvest_runs(partners))}
    return [full.get(h.partner_id, h) if h.state != INVALID else h for h in rows]


def _render(template: str, request: Request, **context: object) -> HTMLResponse:
    # The pages live under <root>/partner-health; run links go to the Airflow UI at <root>.
    here = request.scope.get("root_path", "")
    ui_root = here[: -len(URL_PREFIX)] if here.endswith(URL_PREFIX) else ""
    page = _templates.get_template(template).render(
        ui_root=ui_root, here=here, run_url=lambda run: _run_url(ui_root, run), ago=_ago, when=_when,
        span=_span, ago_span=_ago_span, slug=slug, short=shorten, **context,
    )
    return HTMLResponse(page)


def _run_url(ui_root: str, run: object) -> str | None:
    dag_id, dag_run_id = getattr(run, "dag_id", None), getattr(run, "dag_run_id", None)
    if not dag_id or not dag_run_id:
        return None
    return f"{ui_root}/dags/{quote(dag_id, safe='')}/runs/{quote(dag_run_id, safe='')}"


def _audit_run(run_id: str) -> object:
    """``harvest_runs.run_id`` (``<dag_id>/<Airflow run id>``) as the run link's parts."""
    dag_id, _, dag_run_id = run_id.partition("/")
    return SimpleNamespace(dag_id=dag_id, dag_run_id=dag_run_id or None, run_id=run_id)


def _when(moment: datetime | None) -> str:
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%MZ") if moment else "—"


def _span(delta: timedelta | None) -> str:
    return "—" if delta is None else durations.human(delta)


def _ago_span(delta: timedelta | None) -> str:
    return "—" if delta is None else durations.ago(delta)


def _ago(moment: datetime | None, now: datetime) -> str:
    return durations.ago(now - moment) if moment else "never"


app = create_app()
