"""A small inline SVG chart of a partner's last runs: no JavaScript, no CDN, no library.

Three panels share one x axis (one slot per run, oldest left): records held after the
run (a line), the changes the run made (stacked bars: upserts, purges, quarantined) and
how long its harvest and apply took (bars; failed runs in red): from the harvest's start
(``harvest_runs.started_at``) to the apply's commit, not the whole DAG run, whose
scheduling, ``freeze_window`` and cursor move Airflow shows. Every mark carries a <title> tooltip.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from html import escape

from partner_harvest.store.health import RunInfo

WIDTH, PANEL, GAP, LEFT, RIGHT = 900, 120, 34, 70, 10
COLOURS = {"upserted": "#2e7d32", "purged": "#c62828", "quarantined": "#ef6c00",
           "held": "#1565c0", "duration": "#6a1b9a", "failed": "#c62828"}


def runs_chart(runs: Sequence[RunInfo]) -> str:
    """The SVG markup (a string to embed as-is; every text in it is escaped)."""
    height = 3 * (PANEL + GAP) + 10
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="runs-chart" role="img" width="{WIDTH}" '
             f'height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="11">',
             f"<title>{len(runs)} most recent runs</title>"]
    if not runs:
        parts.append('<text x="10" y="20">No runs yet.</text></svg>')
        return "".join(parts)
    slot = min((WIDTH - LEFT - RIGHT) / len(runs), 30.0)  # a few runs stay narrow bars

    def x(i: int) -> float:
        return LEFT + i * slot

    def label(run: RunInfo) -> str:
        return f"{run.run_id} ({run.status}, {run.started_at:%Y-%m-%d %H:%M}Z)"

    top = GAP - 14
    held = [r.records_held for r in runs]
    parts += _panel(top, "records held", max((h or 0 for h in held), default=0))
    scale = _scale(top, max((h or 0 for h in held), default=0))
    points = [(x(i) + slot / 2, scale(h)) for i, h in enumerate(held) if h is not None]
    if points:
        path = " ".join(f"{px:.1f},{py:.1f}" for px, py in points)
        parts.append(f'<polyline class="held" fill="none" stroke="{COLOURS["held"]}" stroke-width="2" points="{path}"/>')
    for i, run in enumerate(runs):
        if run.records_held is not None:
            parts.append(f'<circle cx="{x(i) + slot / 2:.1f}" cy="{scale(run.records_held):.1f}" r="2.5" '
                         f'fill="{COLOURS["held"]}"><title>{escape(label(run))}: {run.records_held} held</title></circle>')

    top += PANEL + GAP
    changes = [r.upserted + r.purged + r.quarantined for r in runs]
    parts += _panel(top, "changes per run (upserts, purges, quarantined)", max(changes, default=0))
    scale = _scale(top, max(changes, default=0))
    for i, run in enumerate(runs):
        base: float = top + PANEL
        for kind in ("upserted", "purged", "quarantined"):
            value = getattr(run, kind)
            if not value:
                continue
            y = base - (top + PANEL - scale(value))  # stacked on what is below
            parts.append(f'<rect class="{kind}" x="{x(i) + 1:.1f}" y="{y:.1f}" width="{max(slot - 2, 1):.1f}" '
                         f'height="{base - y:.1f}" fill="{COLOURS[kind]}"><title>{escape(label(run))}: '
                         f'{value} {kind}</title></rect>')
            base = y

    top += PANEL + GAP
    seconds = [r.duration.total_seconds() if r.duration else 0.0 for r in runs]
    parts += _panel(top, "harvest to apply, seconds (the DAG run, with Airflow's scheduling, is longer: "
                         "see the run in Airflow)", max(seconds, default=0))
    scale = _scale(top, max(seconds, default=0))
    for i, (run, secs) in enumerate(zip(runs, seconds)):
        colour = COLOURS["failed"] if run.status in ("failed", "abandoned") else COLOURS["duration"]
        y = scale(secs) if secs else top + PANEL - 2  # a failed run without an end still shows
        parts.append(f'<rect class="duration {escape(run.status)}" x="{x(i) + 1:.1f}" y="{y:.1f}" '
                     f'width="{max(slot - 2, 1):.1f}" height="{top + PANEL - y:.1f}" fill="{colour}">'
                     f"<title>{escape(label(run))}: {secs:.1f} s from the harvest's start to the apply's commit"
                     "</title></rect>")
    parts.append("</svg>")
    return "".join(parts)


def _scale(top: float, maximum: float) -> Callable[[float], float]:
    span = maximum or 1
    return lambda v: top + PANEL - (v / span) * PANEL


def _panel(top: float, title: str, maximum: float) -> list[str]:
    """Frame, title and the panel's max/zero ticks."""
    return [
        f'<text x="{LEFT}" y="{top - 6:.0f}" font-weight="bold">{escape(title)}</text>',
        f'<line x1="{LEFT}" y1="{top + PANEL}" x2="{WIDTH - RIGHT}" y2="{top + PANEL}" stroke="#999"/>',
        f'<line x1="{LEFT}" y1="{top}" x2="{LEFT}" y2="{top + PANEL}" stroke="#999"/>',
        f'<text x="{LEFT - 4}" y="{top + 10:.0f}" text-anchor="end">{_short(maximum)}</text>',
        f'<text x="{LEFT - 4}" y="{top + PANEL:.0f}" text-anchor="end">0</text>',
    ]


def _short(value: float) -> str:
    for unit, size in (("M", 1e6), ("k", 1e3)):
        if value >= size:
            return f"{value / size:.1f}{unit}"
    return f"{value:.0f}" if value == int(value) else f"{value:.1f}"
