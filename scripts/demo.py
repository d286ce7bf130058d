"""The main job, end to end on one machine: harvest the demo partners through Airflow.

Starts an embedded PostgreSQL (or uses HARVEST_DATABASE_URL) and the project's four
partner simulators (an OAI-PMH museum, a Sierra library catalogue, a museum publishing an
IIIF Change Discovery stream, a museum publishing dated CSV dumps and deltas in an HTTP
directory), runs each partner's
DAG once (a full harvest: no cursor yet), lets the partners edit, delete and add
records, runs each DAG again (incremental, from the cursors), and prints what landed
from ``harvest_runs`` next to each partner's own live set.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "plugins"), str(ROOT)]

import psycopg  # noqa: E402
from psycopg.conninfo import conninfo_to_dict  # noqa: E402

from include import embedded_pg  # noqa: E402
from include.simulators.files.publisher import Publisher  # noqa: E402
from include.simulators.files.server import DirectoryServer  # noqa: E402
from include.simulators.process import control  # noqa: E402
from include.simulators.process import simulator_process as simulator  # noqa: E402
from partner_harvest.store import connect, ensure_schema  # noqa: E402
from partner_harvest.store.admin import forget_partner, live_identifiers, run_summary  # noqa: E402
from partner_harvest.store.db import one  # noqa: E402

AIRFLOW = str(ROOT / ".venv" / "bin" / "airflow")


SIERRA_KEY, SIERRA_SECRET = "demo-key", "demo-secret"


def airflow_env(pg_uri: str, oai_url: str, sierra_url: str, iiif_url: str, files_url: str) -> dict[str, str]:
    pg = conninfo_to_dict(pg_uri)
    env = dict(os.environ)
    env.update({
        "AIRFLOW_HOME": str(ROOT / ".airflow-demo"),
        "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "PYTHONPATH": os.pathsep.join([str(ROOT / "config"), str(ROOT / "plugins"), str(ROOT)]),
        "HARVEST_PARTNERS_FILE": str(ROOT / "include" / "partners.yaml"),
        "AIRFLOW_CONN_PARTNER_DEMO": json.dumps({"conn_type": "http", "host": oai_url}),
        "AIRFLOW_CONN_PARTNER_DEMO_LIBRARY": json.dumps(
            {"conn_type": "http", "host": sierra_url, "login": SIERRA_KEY, "password": SIERRA_SECRET}),
        "AIRFLOW_CONN_PARTNER_DEMO_STREAM": json.dumps({"conn_type": "http", "host": iiif_url}),
        "AIRFLOW_CONN_PARTNER_DEMO_FILES": json.dumps({"conn_type": "file_delivery", "host": files_url}),
        "AIRFLOW_CONN_AGGREGATION_DB": json.dumps({
            "conn_type": "postgres",
            "host": pg.get("host"),
            "port": int(str(pg["port"])) if pg.get("port") else None,
            "login": pg.get("user"),
            "password": pg.get("password") or None,
            "schema": pg.get("dbname"),
        }),
    })
    return env


def fsspec_local() -> Any:
    import fsspec

    return fsspec.filesystem("file")


def run_dag(env: dict[str, str], dag_id: str, label: str) -> None:
    print(f"\n==> {label}: airflow dags test {dag_id}", flush=True)
    log_path = ROOT / ".airflow-demo" / f"{dag_id}-{label.split()[0].lower()}.log"
    with open(log_path, "w") as log:
        result = subprocess.run([sys.executable, "-m", "airflow", "dags", "test", dag_id],
                                env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    if result.returncode != 0:
        tail = log_path.read_text().splitlines()[-40:]
        raise SystemExit(f"{dag_id} failed ({label}); last lines of {log_path}:\n" + "\n".join(tail))
    print(f"    ok (task log: {log_path.relative_to(ROOT)})")


def mode_label(row: dict) -> str:
    """A run with no cursor harvests everything: say so, whatever mode it was asked for."""
    if row["mode"] == "incremental" and row["window_from"] is None:
        return "full (first harvest)"
    return row["mode"]


def absent_deletions(conn: psycopg.Connection, partner_id: str, run_key: str) -> int:
    """Deletions this run saw of records the database never held (counted as ``unchanged``):
    the tombstones it remembered minus the records it purged."""
    row = one(conn.execute(
        """
        SELECT (SELECT count(*) FROM tombstones WHERE partner_id = %(p)s AND run_id = %(r)s)
             - (SELECT count(*) FROM deletions WHERE partner_id = %(p)s AND run_id = %(r)s AND reason = 'tombstone')
        """,
        {"p": partner_id, "r": run_key},
    ))
    conn.commit()
    return max(int(row[0] or 0), 0)


def summary_lines(conn: psycopg.Connection, partner_id: str) -> list[str]:
    """The partner's runs, oldest first, one line per channel, with what ``unchanged`` holds."""
    rows = list(reversed(run_summary(conn, partner_id, limit=10)))
    lines = [f"harvest_runs for partner '{partner_id}':",
             f"  {'mode':<22}{'channel':<10}{'window from':<22}{'window until':<22}{'pages':>6}{'fetched':>9}"
             f"{'upserted':>9}{'unchanged':>10}{'purged':>7}{'quarant.':>9}  status"]
    notes: dict[str, int] = {}
    for row in rows:
        start = row["window_from"].strftime("%Y-%m-%dT%H:%M:%SZ") if row["window_from"] else "(everything)"
        lines.append(
            f"  {mode_label(row):<22}{row['channel']:<10}{start:<22}"
            f"{row['window_until'].strftime('%Y-%m-%dT%H:%M:%SZ'):<22}{row['pages']:>6}{row['fetched']:>9}"
            f"{row['upserted']:>9}{row['unchanged']:>10}{row['purged']:>7}{row['quarantined']:>9}  {row['status']}")
        if row["status"] == "applied" and row["run_id"] not in notes:
            notes[row["run_id"]] = absent_deletions(conn, partner_id, row["run_id"])
    for run_key, absent in notes.items():
        if absent:
            lines.append(f"  {run_key}: {absent} deletion{'s' if absent != 1 else ''} already absent (records this "
                         "database never held; counted as unchanged, nothing lost)")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=5000, help="size of the demo collection")
    args = parser.parse_args()

    pg_uri = embedded_pg.start("demo", keep_running=True)
    where = "HARVEST_DATABASE_URL" if os.environ.get(embedded_pg.DATABASE_URL_ENV) else "embedded PostgreSQL (pgserver)"
    print(f"==> aggregation database: {where}")
    partners = {"demo": "harvest_demo", "demo_library": "harvest_demo_library", "demo_stream": "harvest_demo_stream",
                "demo_files": "harvest_demo_files"}
    with connect(pg_uri) as conn:
        ensure_schema(conn)
        for partner_id in partners:
            forget_partner(conn, partner_id)
    n = args.records
    oai_args = ("--records", str(n), "--page-size", "200", "--granularity", "seconds", "--formats", "oai_dc,lido")
    sierra_args = ("--bibs", str(n), "--client-key", SIERRA_KEY, "--client-secret", SIERRA_SECRET)
    iiif_args = ("--objects", str(n), "--page-sizes", "100", "--fractions")
    folder = ROOT / ".airflow-demo" / "files"  # the museum's deliveries, served as an HTTP directory
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    museum = Publisher(fsspec_local(), str(folder))
    yesterday = datetime.now(timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0) - timedelta(days=1)
    museum.create(n)
    museum.full(yesterday - timedelta(days=1), parts=2)
    with simulator("oai_pmh", *oai_args) as oai_url, simulator("sierra", *sierra_args) as sierra_url, \
            simulator("iiif", *iiif_args) as iiif_base, DirectoryServer(folder) as files_server:
        iiif_url = f"{iiif_base}/stream/collection.json"
        files_url = f"{files_server.base_url}/"
        print(f"==> partner 'demo': OAI-PMH simulator at {oai_url} ({n} records)")
        print(f"==> partner 'demo_library': Sierra simulator at {sierra_url} ({n} bibs)")
        print(f"==> partner 'demo_stream': IIIF Change Discovery simulator at {iiif_url} ({n} objects)")
        print(f"==> partner 'demo_files': dated CSV dumps and deltas at {files_url} ({n} objects, a full dump of "
              f"{museum.deliveries[0][0]} in two parts)")
        urls = {"demo": oai_url, "demo_library": sierra_url, "demo_stream": iiif_url}
        env = airflow_env(pg_uri, oai_url, sierra_url, iiif_url, files_url)
        (ROOT / ".airflow-demo").mkdir(exist_ok=True)
        subprocess.run([AIRFLOW, "db", "migrate"], env=env, cwd=ROOT, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for partner_id in partners:
            for key in (f"harvest_cursor__{partner_id}", f"harvest_cursor__{partner_id}__deletions"):
                subprocess.run([AIRFLOW, "variables", "delete", key], env=env, cwd=ROOT,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

        for dag_id in partners.values():
            run_dag(env, dag_id, "First run (no cursor: full harvest)")
        for partner_id, url in urls.items():
            if partner_id == "demo_library":
                control(url, "advance_clock", {"seconds": 3600})
            changes = {"edit": n // 100, "delete": n // 200, "add": n // 200}
            if partner_id == "demo_stream":
                changes["move"] = n // 500
            changed = control(url, "mutate", changes)
            moved = f", moved {len(changed['moved'])}" if "moved" in changed else ""
            print(f"\n==> partner '{partner_id}' edited {len(changed['edited'])}, deleted {len(changed['deleted'])}"
                  f"{moved} and added {len(changed['added'])} records")
        edited, deleted, added = museum.edit(n // 100), museum.delete(n // 200), museum.create(n // 200)
        museum.delta(yesterday)
        print(f"\n==> partner 'demo_files' edited {len(edited)}, deleted {len(deleted)} and added {len(added)} "
              f"records: the delta of {museum.deliveries[-1][0]}")
        for dag_id in partners.values():
            run_dag(env, dag_id, "Second run (incremental from the cursor)")

        # what each partner publishes: Sierra's suppressed bibs are not (options.sierra.suppressed: purge)
        upstream = {pid: control(url, "public_ids" if pid == "demo_library" else "live_ids") for pid, url in urls.items()}
        upstream["demo_files"] = museum.published_ids()
        with connect(pg_uri) as conn:
            held = {}
            for partner_id in partners:
                print()
                print("\n".join(summary_lines(conn, partner_id)))
                held[partner_id] = live_identifiers(conn, partner_id)
        cursors = {
            key: subprocess.run([AIRFLOW, "variables", "get", key], env=env, cwd=ROOT,
                                capture_output=True, text=True).stdout.strip()
            for key in ("harvest_cursor__demo", "harvest_cursor__demo_library", "harvest_cursor__demo_library__deletions",
                        "harvest_cursor__demo_stream", "harvest_cursor__demo_files")
        }
    all_same = True
    print()
    for partner_id in partners:
        same = held[partner_id] == upstream[partner_id]
        all_same = all_same and same
        print(f"records for '{partner_id}': {len(held[partner_id])}; the partner's live set: "
              f"{len(upstream[partner_id])}; identical: {'yes' if same else 'NO'}")
    for key, value in cursors.items():
        until = json.loads(value)["until"] if value.startswith("{") else value
        print(f"cursor Variable {key}: until {until}")
    print("\nThe embedded PostgreSQL keeps running for a look around:")
    print(f"  psql '{pg_uri}' -c 'SELECT * FROM harvest_runs'")
    print("Stop it with: .venv/bin/python -c 'from include import embedded_pg; embedded_pg.stop(\"demo\")'")
    return 0 if all_same else 1

if __name__ == "__main__":
    raise SystemExit(main())
