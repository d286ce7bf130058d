"""The hosts' shared pacing state in PostgreSQL (``host_pacing``, ``partner_pacing``).

One short parameterised UPDATE ... RETURNING per paced request, in autocommit: the host's
row is locked for that statement only. The database's clock decides the slots, so workers
whose clocks disagree still keep the gap. The logic around it: ``politeness.Pacer``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

from partner_harvest.politeness import Reservation
from partner_harvest.store.db import connect

WINDOW = "interval '60 seconds'"  # the counting window of the effective rate
# The back-off wears off with healthy responses and with time: it halves for every minute
# since the row last changed, so a host that recovered between nights is not crawled at the
# last outage's pace by the next night (the decay compounds once per write: memoryless).
def _penalty(now: str, healthy: str = " * power(1 - %(recovery)s, %(healthy)s)") -> str:
    """The back-off at ``now``: decayed by the healthy responses (``healthy``) and by time."""
    decayed = f"h.penalty_ms{healthy} * power(0.5, greatest(0, extract(epoch FROM {now} - h.updated_at)) / 60.0)"
    return f"(CASE WHEN {decayed} < 20 THEN 0 ELSE {decayed} END)"


_PENALTY = _penalty("c.now")
_GAP = f"greatest(%(delay)s::double precision, {_PENALTY})"
_ROLL = f"c.now - h.window_start >= {WINDOW}"
_RESERVE = f"""
UPDATE host_pacing AS h SET
    penalty_ms = {_PENALTY},
    last_gap_ms = {_GAP},
    next_slot = greatest(h.next_slot, c.now) + make_interval(secs => {_GAP} / 1000.0),
    last_rate = CASE WHEN {_ROLL}
                     THEN h.window_requests / extract(epoch FROM c.now - h.window_start)::double precision
                     ELSE h.last_rate END,
    window_start = CASE WHEN {_ROLL} THEN c.now ELSE h.window_start END,
    window_requests = CASE WHEN {_ROLL} THEN 1 ELSE h.window_requests + 1 END,
    updated_at = c.now
FROM (SELECT clock_timestamp() AS now) AS c
WHERE h.host = %(host)s
RETURNING extract(epoch FROM h.next_slot - make_interval(secs => h.last_gap_ms / 1000.0) - clock_timestamp()),
          h.last_gap_ms, h.penalty_ms
"""
_STRAIN = """
INSERT INTO host_pacing AS h (host, penalty_ms, strained_at, strains, next_slot)
VALUES (%(host)s, least(%(step)s, %(cap)s), clock_timestamp(), 1,
        clock_timestamp() + make_interval(secs => least(%(step)s, %(cap)s) / 1000.0))
ON CONFLICT (host) DO UPDATE SET
    penalty_ms = CASE WHEN h.strained_at > clock_timestamp() - make_interval(secs => h.penalty_ms / 1000.0)
                      THEN h.penalty_ms  -- grown once within the current gap already (other slices saw it too)
                      ELSE least(%(cap)s, greatest(h.penalty_ms * 2, %(step)s)) END,
    strained_at = CASE WHEN h.strained_at > clock_timestamp() - make_interval(secs => h.penalty_ms / 1000.0)
                       THEN h.strained_at ELSE clock_timestamp() END,
    strains = h.strains + 1,
    updated_at = clock_timestamp()
RETURNING h.penalty_ms
"""
# The strained host's next request waits a whole back-off from now, whatever was reserved.
_PUSH = """
UPDATE host_pacing SET next_slot = greatest(next_slot, clock_timestamp() + make_interval(secs => penalty_ms / 1000.0))
WHERE host = %(host)s
"""


class PgPacingStore:
    """A session's own autocommit connection to the pacing rows (opened on first need)."""

    def __init__(self, conninfo: str):
        self.conn = connect(conninfo, autocommit=True)

    def register(self, partner_id: str, host: str, delay_ms: int) -> None:
        self.conn.execute(
            "INSERT INTO partner_pacing (partner_id, host, delay_ms) VALUES (%s, %s, %s)"
            " ON CONFLICT (partner_id) DO UPDATE SET host = excluded.host, delay_ms = excluded.delay_ms,"
            " seen_at = now()", (partner_id, host, delay_ms))

    def reserve(self, host: str, delay_ms: int, healthy: int, recovery: float) -> Reservation:
        params = {"host": host, "delay": float(delay_ms), "healthy": healthy, "recovery": recovery}
        row = self.conn.execute(_RESERVE, params).fetchone()
        if row is None:  # the host's first paced request: its row, then the same reservation
            self.conn.execute("INSERT INTO host_pacing (host) VALUES (%s) ON CONFLICT (host) DO NOTHING", (host,))
            row = self.conn.execute(_RESERVE, params).fetchone()
            assert row is not None
        wait, gap, penalty = row
        return Reservation(max(float(wait), 0.0), float(gap), float(penalty))

    def strain(self, host: str, step_ms: int, cap_ms: int) -> float:
        params = {"host": host, "step": float(step_ms), "cap": float(cap_ms)}
        with self.conn.transaction():
            row = self.conn.execute(_STRAIN, params).fetchone()
            self.conn.execute(_PUSH, params)
        assert row is not None
        return float(row[0])

    def close(self) -> None:
        self.conn.close()


@dataclass(frozen=True)
class HostRate:
    """What the health page shows of a partner's pacing: the rate in force at its host now
    (the back-off as it has worn off by now, not as the last request left it) and the rate seen."""

    host: str
    delay_ms: int
    penalty_ms: float  # the back-off in force now (0 once worn off)
    limit_per_s: float | None  # None: no delay and no back-off, nothing limits the rate
    recent_per_s: float | None  # reservations per second in the current or last minute
    strains: int
    strained_at: datetime | None
    partners: int = 1  # partners paced at this host: the rate is the host's, shared by them

    def describe(self) -> str:
        limit = f"at most {self.limit_per_s:.3g} requests/s" if self.limit_per_s else "no limit"
        shared = f", shared by the {self.partners} partners on it" if self.partners > 1 else ""
        backoff = (f"back-off {self.penalty_ms:.0f} ms in force, halving each minute the host is healthy"
                   if self.penalty_ms else "no back-off in force")
        parts = [f"{self.host}: {limit} for the host{shared} (request_delay {self.delay_ms} ms, {backoff})"]
        if self.recent_per_s is not None:
            parts.append(f"{self.recent_per_s:.3g} requests/s paced in the last minute")
        return "; ".join(parts)


# The back-off as it stands now: what the next reservation would find (worn off by time; the
# healthy responses are counted only by a reservation).
_PENALTY_NOW = _penalty("now()", healthy="")


def partner_rate(conn: psycopg.Connection[Any], partner_id: str) -> HostRate | None:
    """The partner's host's effective rate; None when the partner was never paced."""
    row = conn.execute(
        f"""SELECT p.host, p.delay_ms, coalesce({_PENALTY_NOW}, 0), h.strains, h.strained_at,
                   CASE WHEN h.window_start > now() - {WINDOW} AND now() > h.window_start
                        THEN h.window_requests / greatest(extract(epoch FROM now() - h.window_start), 1)::double precision
                        ELSE h.last_rate END,
                   (SELECT count(*) FROM partner_pacing o WHERE o.host = p.host)
              FROM partner_pacing p LEFT JOIN host_pacing h ON h.host = p.host
             WHERE p.partner_id = %s""", (partner_id,)).fetchone()
    conn.commit()
    if row is None:
        return None
    host, delay_ms, penalty, strains, strained_at, recent, partners = row
    gap = max(float(delay_ms), float(penalty))
    return HostRate(host, int(delay_ms), float(penalty), 1000.0 / gap if gap > 0 else None,
                    float(recent) if recent is not None else None, int(strains or 0), strained_at, int(partners))
