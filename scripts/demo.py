"""The main job, end to end on one machine: harvest the demo partners through Airflow.

Starts an embedded PostgreSQL (or uses HARVEST_DATABASE_URL) and the project's OAI-PMH
simulator, runs ``harvest_demo`` once (a full harvest: no cursor yet), lets the partner
edit, delete and add records, runs it again (incremental, from the cursor), and prints
what landed from ``harvest_runs`` next to the partner's own live set.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "plugins"), str(ROOT)]

from psycopg.conninfo import conninfo_to_dict  # noqa: E402

from include import embedded_pg  # noqa: E402
from partner_harvest.store import connect, ensure_schema  # noqa: E402
from partner_harvest.store.admin import forget_partner, live_identifiers, run_summary  # noqa: E402

AIRFLOW = str(ROOT / ".venv" / "bin" / "airflow")


def airflow_env(pg_uri: str, oai_url: str) -> dict[str, str]:
    pg = conninfo_to_dict(pg_uri)
    env = dict(os.environ)
    env.update({
        "AIRFLOW_HOME": str(ROOT / ".airflow-demo"),
        "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(ROOT / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "PYTHONPATH": os.pathsep.join([str(ROOT / "plugins"), str(ROOT)]),
        "HARVEST_PARTNERS_FILE": str(ROOT / "include" / "partners.yaml"),
        "AIRFLOW_CONN_PARTNER_DEMO": json.dumps({"conn_type": "http", "host": oai_url}),
        "AIRFLOW_CONN_AGGREGATION_DB": json.dumps({
            "conn_type": "postgres",
            "host": pg.get("host"),
            "port": int(pg["port"]) if pg.get("port") else None,
            "login": pg.get("user"),
            "password": pg.get("password") or None,
            "schema": pg.get("dbname"),
        }),
    })
    return env


@contextmanager
def oai_simulator(records: int) -> Iterator[str]:
    cmd = [sys.executable, "-m", "include.simulators.oai_pmh", "--records", str(records),
           "--page-size", "200", "--granularity", "seconds", "--formats", "oai_dc,lido", "--port", "0"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline().strip() if proc.stdout else ""
        if not line.startswith("listening on "):
            raise SystemExit(f"the OAI-PMH simulator did not start: {line!r}")
        yield line.removeprefix("listening on ")
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def control(oai_url: str, action: str, body: dict | None = None, method: str = "POST") -> object:
    base = oai_url.rsplit("/", 1)[0]
    data = json.dumps(body or {}).encode() if method == "POST" else None
    request = urllib.request.Request(f"{base}/_control/{action}", data=data, method=method,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        payload = response.read().decode()
    return json.loads(payload) if action != "live_ids" else set(payload.split())


def run_dag(env: dict[str, str], dag_id: str, label: str) -> None:
    print(f"\n==> {label}: airflow dags test {dag_id}", flush=True)
    log_path = ROOT / ".airflow-demo" / f"{dag_id}-{label.split()[0].lower()}.log"
    with open(log_path, "w") as log:
        result = subprocess.run([AIRFLOW, "dags", "test", dag_id], env=env, cwd=ROOT,
                                stdout=log, stderr=subprocess.STDOUT)
    if result.returncode != 0:
        tail = log_path.read_text().splitlines()[-40:]
        raise SystemExit(f"{dag_id} failed ({label}); last lines of {log_path}:\n" + "\n".join(tail))
    print(f"    ok (task log: {log_path.relative_to(ROOT)})")


def print_runs(conn, partner_id: str) -> None:
    rows = list(reversed(run_summary(conn, partner_id, limit=10)))
    print(f"\nharvest_runs for partner '{partner_id}':")
    header = f"  {'mode':<12}{'window from':<22}{'window until':<22}{'pages':>6}{'fetched':>9}" \
             f"{'upserted':>9}{'unchanged':>10}{'purged':>7}{'quarant.':>9}  status"
    print(header)
    for row in rows:
        start = row["window_from"].strftime("%Y-%m-%dT%H:%M:%SZ") if row["window_from"] else "(full)"
        print(f"  {row['mode']:<12}{start:<22}{row['window_until'].strftime('%Y-%m-%dT%H:%M:%SZ'):<22}"
              f"{row['pages']:>6}{row['fetched']:>9}{row['upserted']:>9}{row['unchanged']:>10}"
              f"{row['purged']:>7}{row['quarantined']:>9}  {row['status']}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=5000, help="size of the demo collection")
    args = parser.parse_args()

    pg_uri = embedded_pg.start("demo", keep_running=True)
    print(f"==> aggregation database: {'HARVEST_DATABASE_URL' if os.environ.get(embedded_pg.DATABASE_URL_ENV) else 'embedded PostgreSQL (pgserver)'}")
    with connect(pg_uri) as conn:
        ensure_schema(conn)
        forget_partner(conn, "demo")
    with oai_simulator(args.records) as oai_url:
        print(f"==> demo partner: OAI-PMH simulator at {oai_url} ({args.records} records)")
        env = airflow_env(pg_uri, oai_url)
        (ROOT / ".airflow-demo").mkdir(exist_ok=True)
        subprocess.run([AIRFLOW, "db", "migrate"], env=env, cwd=ROOT, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        subprocess.run([AIRFLOW, "variables", "delete", "harvest_cursor__demo"], env=env, cwd=ROOT,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

        run_dag(env, "harvest_demo", "First run (no cursor: full harvest)")
        n = args.records
        changed = control(oai_url, "mutate", {"edit": n // 100, "delete": n // 200, "add": n // 200})
        print(f"\n==> the partner edited {len(changed['edited'])}, deleted {len(changed['deleted'])} "
              f"and added {len(changed['added'])} records")
        run_dag(env, "harvest_demo", "Second run (incremental from the cursor)")

        upstream = control(oai_url, "live_ids", method="GET")
        with connect(pg_uri) as conn:
            print_runs(conn, "demo")
            held = live_identifiers(conn, "demo")
        cursor = subprocess.run([AIRFLOW, "variables", "get", "harvest_cursor__demo"], env=env,
                                cwd=ROOT, capture_output=True, text=True).stdout.strip()
    same = held == upstream
    print(f"\nrecords for 'demo': {len(held)}; the partner's live set: {len(upstream)}; "
          f"identical: {'yes' if same else 'NO'}")
    print(f"cursor Variable harvest_cursor__demo = {cursor}")
    print("\nThe embedded PostgreSQL keeps running for a look around:")
    print(f"  psql '{pg_uri}' -c 'SELECT * FROM harvest_runs'")
    print("Stop it with: .venv/bin/python -c 'from include import embedded_pg; embedded_pg.stop(\"demo\")'")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
