"""One harvest DAG run through Airflow (dag.test(), in a child process with the package's
entry points: tests/support/provider.py) with the OpenLineage provider's file transport
and Airflow's StatsD metrics switched on by environment variables, as a deployment would:

- the OpenLineage events name the partner's endpoint as the harvest's input, staging as
  its output, and the aggregation tables as the apply's outputs (hook-level lineage,
  namespaces and names by OpenLineage's conventions);
- a StatsD listener on loopback receives the run's metrics by the names
  docs/operator/metrics.md lists, with the values harvest_runs and the simulator hold.

Then, in the same child, the partner's reconcile after deletions at the partner: its
purge counted by the metrics and its writes to the live tables in its lineage.

A child process: Airflow builds its plugin list, hook lineage collector and providers once
per process, from the environment it starts with.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import IO
from urllib.parse import urlsplit

import psycopg
import pytest

from include.simulators.oai_pmh import OaiSimulator, SimulatedRepository
from partner_harvest import metrics
from partner_harvest.store.db import one
from tests.support.provider import package_metadata, python_path
from tests.support.statsd import StatsdListener, parse

pytestmark = pytest.mark.airflow
PARTNER = "dagmuseum"  # registry, Connection and simulator: tests/dags/conftest.py (partner_env)

# A deployment runs each task in a process of its own, whose hook lineage collector starts
# empty; dag.test() runs them all in this one, so each task starts with an empty collector
# here (a listener of the child), or every task would report its predecessors' lineage too.
RUN = """
import json
import sys
from airflow.listeners import hookimpl
from airflow.sdk.lineage import get_hook_lineage_collector
from airflow.sdk.listener import get_listener_manager
from tests.support.dags import build_dag, task_states

class OwnProcessPerTask:
    @hookimpl
    def on_task_instance_running(self, previous_state, task_instance):
        get_hook_lineage_collector.cache_clear()

get_listener_manager().add_listener(OwnProcessPerTask())
run = build_dag("dagmuseum").test()
# One write per marker line: a library thread logging to stdout may not land between a line and its newline.
sys.stdout.write("STATES=" + json.dumps(task_states(run)) + "\\n")
sys.stdout.write("RUN_ID=" + run.run_id + "\\n")
sys.stdout.flush()
input()  # the parent deletes records at the partner, then says go

from partner_harvest.airflow.dag_factory import build_reconcile_dag
from partner_harvest.registry import get_partner
reconcile = build_reconcile_dag(get_partner("dagmuseum"))
for task in reconcile.tasks:
    task.retries = 0
run = reconcile.test()
sys.stdout.write("RECONCILE_STATES=" + json.dumps(task_states(run)) + "\\n")
sys.stdout.flush()
"""


def test_a_harvest_run_emits_its_lineage_and_its_metrics(partner_env: OaiSimulator, repo: SimulatedRepository, db: str,
                                                         tmp_path: Path) -> None:
    sim = partner_env
    statsd = StatsdListener()
    events_file = tmp_path / "openlineage.jsonl"
    env = dict(os.environ)
    env.update({
        "PYTHONPATH": python_path(package_metadata(tmp_path / "metadata")),
        # the partner's Connection as the Connections page now makes it: of type oai_pmh
        "AIRFLOW_CONN_PARTNER_DAGMUSEUM": json.dumps({"conn_type": "oai_pmh", "host": sim.base_url,
                                                      "extra": {"verify": "", "proxy": ""}}),
        "AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps({"type": "file", "log_file_path": str(events_file),
                                                       "append": True}),
        "AIRFLOW__OPENLINEAGE__NAMESPACE": "harvest-test",
        "AIRFLOW__METRICS__STATSD_ON": "True",
        "AIRFLOW__METRICS__STATSD_HOST": "127.0.0.1",
        "AIRFLOW__METRICS__STATSD_PORT": str(statsd.port),
        "AIRFLOW__METRICS__STATSD_PREFIX": "airflow",
    })
    served_before = sim.requests_served
    started = time.monotonic()
    stderr = (tmp_path / "child.stderr").open("w+")
    child = subprocess.Popen([sys.executable, "-c", RUN], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=stderr, text=True, cwd=Path(__file__).resolve().parents[2])
    try:
        assert child.stdout is not None and child.stdin is not None
        out = "".join(iter_lines_until(child.stdout, "RUN_ID="))
        took, harvest_done_at, clock_at_harvest = time.monotonic() - started, datetime.now(timezone.utc), repo.clock
        assert "RUN_ID=" in out, tail(stderr)
        states = json.loads(out.split("STATES=", 1)[1].splitlines()[0])
        assert set(states.values()) == {"success"}, states
        run_key = f"harvest_{PARTNER}/" + out.split("RUN_ID=", 1)[1].splitlines()[0]
        received = parse(statsd.lines(), "airflow.partner_harvest.")  # the harvest's tasks have sent theirs
        live_at_harvest, served_by_harvest = len(repo.live_identifiers()), sim.requests_served
        gone = repo.delete(7)  # within the purge limit: the reconcile applies in its own task
        child.stdin.write("go\n")
        child.stdin.flush()
        rest, _ = child.communicate(timeout=600)
        assert child.returncode == 0, tail(stderr)
        reconcile_states = json.loads(rest.split("RECONCILE_STATES=", 1)[1].splitlines()[0])
        reconciled = parse(statsd.lines(), "airflow.partner_harvest.")
    finally:
        if child.poll() is None:
            child.kill()
        statsd.close()

    # -- metrics: names from partner_harvest.metrics, values from harvest_runs and the simulator
    with psycopg.connect(db) as conn:
        row = one(conn.execute(
            "SELECT sum(fetched), sum(upserted), sum(unchanged), sum(purged), sum(quarantined) FROM harvest_runs "
            "WHERE partner_id = %s AND run_id = %s", (PARTNER, run_key)))
    audit = dict(zip(metrics.APPLY_COUNTS, (int(v) for v in row)))
    assert audit["upserted"] == live_at_harvest > 0

    def total(key: str) -> float:
        name = metrics.metric(key).name(PARTNER)[len("partner_harvest."):]
        assert name in received, f"{name} not received; got {sorted(received)}"
        return sum(v for v, _ in received[name])

    for key, value in audit.items():
        assert total(key) == value, key
        assert {k for _, k in received[f"{key}.{PARTNER}"]} == {"c"}
    assert total("runs_applied") == 1
    assert total("warnings") == 0
    assert total("requests") == served_by_harvest - served_before  # every response, counted once
    assert total("response_bytes") > 400 * 100  # 400 records' XML, decoded
    (seconds, kind), = received[f"run_seconds.{PARTNER}"]
    assert kind == "ms" and 0 < seconds < took * 1000
    (lag, kind), = received[f"cursor_lag_seconds.{PARTNER}"]
    expected_lag = (harvest_done_at - clock_at_harvest).total_seconds()
    assert kind == "g" and expected_lag - took - 1 <= lag <= expected_lag + 1
    assert set(received) <= {m.name(PARTNER)[len("partner_harvest."):] for m in metrics.METRICS}

    # -- lineage: the OpenLineage events the file transport wrote
    events = [json.loads(line) for line in events_file.read_text().splitlines() if line.strip()]
    complete = {e["job"]["name"]: e for e in events if e.get("eventType") == "COMPLETE" and "job" in e}
    harvest = complete[f"harvest_{PARTNER}.harvest_changes"]
    assert harvest["job"]["namespace"] == "harvest-test"
    origin = urlsplit(sim.base_url)
    endpoint = {"namespace": f"http://{origin.hostname}:{origin.port}", "name": origin.path}
    dbname = psycopg.conninfo.conninfo_to_dict(db)["dbname"]

    def names(datasets: list[dict]) -> list[tuple[str, str]]:
        return sorted((d["namespace"], d["name"]) for d in datasets)

    assert names(harvest["inputs"]) == [(endpoint["namespace"], endpoint["name"])]
    (namespace, staging), = names(harvest["outputs"])
    assert namespace.startswith("postgres://") and staging == f"{dbname}.public.staging"
    apply = complete[f"harvest_{PARTNER}.apply_changes"]
    assert names(apply["inputs"]) == [(namespace, f"{dbname}.public.staging")]
    assert names(apply["outputs"]) == [(namespace, f"{dbname}.public.{t}") for t in ("deletions", "quarantine", "records")]
    freeze = complete[f"harvest_{PARTNER}.freeze_window"]
    assert names(freeze["inputs"]) == [(endpoint["namespace"], endpoint["name"])]  # it asks the partner's clock
    assert "secret" not in events_file.read_text()

    # -- the reconcile: its purge counted, its writes to the live tables named
    assert reconcile_states["reconcile"] == "success", reconcile_states
    assert sum(v for v, _ in reconciled[f"purged.{PARTNER}"]) == len(gone) == 7
    assert sum(v for v, _ in reconciled[f"upserted.{PARTNER}"]) == 0  # nothing was missing
    assert sum(v for v, _ in reconciled[f"runs_applied.{PARTNER}"]) == 1
    assert sum(v for v, _ in reconciled[f"requests.{PARTNER}"]) > 0
    events = [json.loads(line) for line in events_file.read_text().splitlines() if line.strip()]
    complete = {e["job"]["name"]: e for e in events if e.get("eventType") == "COMPLETE" and "job" in e}
    swept = complete[f"reconcile_{PARTNER}.reconcile"]
    assert names(swept["inputs"]) == [(endpoint["namespace"], endpoint["name"])]
    assert names(swept["outputs"]) == [(namespace, f"{dbname}.public.{t}") for t in ("deletions", "records")]
    with psycopg.connect(db) as conn:
        held = {r[0] for r in conn.execute("SELECT identifier FROM records WHERE partner_id = %s", (PARTNER,))}
    assert held == repo.live_identifiers()


def iter_lines_until(stream: Iterable[str], marker: str) -> Iterator[str]:
    """The child's output up to and including the line that starts with ``marker``."""
    for line in stream:
        yield line
        if line.startswith(marker):
            return


def tail(stderr: IO[str]) -> str:
    stderr.flush()
    stderr.seek(0)
    return stderr.read()[-4000:]
