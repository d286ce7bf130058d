"""Time to the first alert with the defaults, through a real Airflow: an outage and a missing Connection.

Two partners with every default of the registry (retries, retry delays, the HTTP policy):
``outage``, whose endpoint is a closed port on loopback (connection refused), and ``noconn``,
whose Connection is not defined. Both are triggered at once in the e2e stack's Airflow
(scheduler, api-server, dag-processor on loopback; tests/support/e2e_stack.py); the alerts go
to the stack's SMTP sink, read every second. Printed, per partner: seconds from the trigger to
the first alert, to the run's end, and the subject of every alert, as JSON on the last line.
The expected figures come from the configured delays (docs/operator/alerts.md).

    .venv/bin/python benchmarks/first_alert.py [--timeout 2700] [--first-only]

Not a timed test: with the defaults, before the fast failure, it takes over half an hour.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "plugins")]

from include import embedded_pg  # noqa: E402
from tests.support.airflow_stack import free_loopback_port, http_connection  # noqa: E402
from tests.support.e2e_stack import start_airflow  # noqa: E402

PARTNERS = ("outage", "noconn")


def registry(path: Path) -> None:
    path.write_text(
        "partners:\n"
        + "".join(f"  - {{id: {pid}, protocol: oai-pmh, conn_id: partner_{pid}, metadata_prefix: oai_dc}}\n"
                  for pid in PARTNERS),
        encoding="utf-8")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--timeout", type=float, default=2700, help="seconds to wait for both runs to end")
    parser.add_argument("--first-only", action="store_true",
                        help="stop once each partner's first alert came (not waiting for the runs to end)")
    args = parser.parse_args()
    server = embedded_pg.start("bench")
    with ExitStack() as cleanup:
        base = Path(cleanup.enter_context(tempfile.TemporaryDirectory(prefix="first_alert_")))
        closed = f"http://127.0.0.1:{free_loopback_port()}/oai"
        stack = start_airflow(server, base, cleanup, {"AIRFLOW_CONN_PARTNER_OUTAGE": http_connection(closed)},
                              registry_writer=registry, dag_ids=[f"harvest_{p}" for p in PARTNERS])
        started = time.monotonic()
        runs = {pid: stack.trigger(f"harvest_{pid}", {"mode": "incremental"})["dag_run_id"] for pid in PARTNERS}
        first: dict[str, float] = {}
        ended: dict[str, float] = {}
        seen = 0
        while (len(first) if args.first_only else len(ended)) < len(PARTNERS) and \
                time.monotonic() - started < args.timeout:
            mails = stack.sink.messages
            for mail in mails[seen:]:
                for pid in PARTNERS:
                    if f" {pid}:" in mail.subject and pid not in first:
                        first[pid] = time.monotonic() - started
                print(f"{time.monotonic() - started:7.1f} s  {mail.subject}", flush=True)
            seen = len(mails)
            for pid, run_id in runs.items():
                if pid not in ended:
                    state = stack.api("GET", f"/dags/harvest_{pid}/dagRuns/{run_id}")["state"]
                    if state in ("success", "failed"):
                        ended[pid] = time.monotonic() - started
                        print(f"{ended[pid]:7.1f} s  harvest_{pid} {state}", flush=True)
            time.sleep(1)
        time.sleep(5)  # a final alert sent as the run ends
        subjects = [m.subject for m in stack.sink.messages]
    result = {pid: {"first_alert_s": round(first[pid], 1) if pid in first else None,
                    "run_ended_s": round(ended[pid], 1) if pid in ended else None} for pid in PARTNERS}
    result["alerts"] = subjects  # type: ignore[assignment]
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
