"""A file-delivery partner reading the publisher simulator's location, run as the DAG runs it."""

from __future__ import annotations

from typing import Any

import psycopg

from include.simulators.files.publisher import OPTIONS
from partner_harvest.factory import Endpoint
from partner_harvest.registry import Partner
from partner_harvest.run import RunResult
from tests.support.harness import Harness
from tests.support.partners import WHOLE, _entry, partner_from_entry


def files_partner(id: str = "museum_files", *, files: dict[str, Any] | None = None, **fields: Any) -> Partner:
    """A file-delivery partner of the publisher's layout (include/simulators/files/publisher.OPTIONS)."""
    options: dict[str, Any] = {"files": {**OPTIONS, **(files or {})}}
    defaults = {"id": id, "protocol": "file-delivery", "conn_id": "unused", "lag": "0s", "slicing": dict(WHOLE),
                "options": options}
    return partner_from_entry(_entry(defaults, fields))


class FilesHarness(Harness):
    """``endpoint``: the location's URL, and the store's key and extras (S3)."""

    def __init__(self, url: str, conn: psycopg.Connection, partner: Partner, *, login: str | None = None,
                 password: str | None = None, extra: dict[str, Any] | None = None):
        super().__init__(None, conn, partner)
        self.url, self.login, self.password, self.extra = url, login, password, extra or {}

    def endpoint(self) -> Endpoint:
        return Endpoint(self.url, self.login, self.password, self.extra)

    def run(self, mode: str = "incremental", **kw: Any) -> RunResult:
        return self.run_through(mode, **kw)

    def applied_deliveries(self) -> list[tuple[str, str, str]]:
        """(run, date, kind) of every delivery an applied run read, in run order."""
        rows = self.conn.execute(
            """
            SELECT DISTINCT d.run_id, to_char(d.delivered, 'YYYYMMDD'), d.kind FROM delivery_files d
            JOIN harvest_runs h USING (partner_id, run_id, channel)
            WHERE d.partner_id = %s AND h.status = 'applied' ORDER BY 1, 2, 3
            """, (self.partner.id,)).fetchall()
        self.conn.commit()
        return [(str(r[0]), str(r[1]), str(r[2])) for r in rows]
