"""One harvest DAG run through Airflow (dag.test(), in a child process with the package's
entry points: tests/support/provider.py) with the OpenLineage provider's file transport
and Airflow's StatsD metrics switched on by environment variables, as a deployment would:

- the OpenLineage events name the partner's endpoint as the harvest's input, staging as
  its output, and the aggregation tables as the apply's outputs (hook-level lineage,
  namespaces and names by OpenLineage's conventions);
- a StatsD listener on loopback receives the run's metrics by the names
  docs/operator/metrics.md lists, with the values harvest_runs and the simulator hold.

A child process: Airflow builds its plugin list, hook lineage collector and providers once
per process, from the environment it starts with.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import urlsplit

import psycopg
import pytest

from partner_harvest import metrics
from tests.support.provider import package_metadata, python_path

pytestmark = pytest.mark.airflow
PARTNER = "dagmuseum"  # registry, Connection and simulator: tests/dags/conftest.py (partner_env)

# A deployment runs each task in a process of its own, whose hook lineage collector starts
# empty; dag.test() runs them all in this one, so each task starts with an empty collector
# here (a listener of the child), or every task would report its predecessors' lineage too.
RUN = """
import json
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
print("STATES=" + json.dumps(task_states(run)))
print("RUN_ID=" + run.run_id)
"""


class StatsdListener:
    """A StatsD server on loopback: keeps every datagram (``name:value|type`` lines)."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 * 1024 * 1024)
        self.port = self.sock.getsockname()[1]

    def lines(self) -> list[str]:
        """Everything received so far (the sender has exited: loopback datagrams are queued)."""
        self.sock.setblocking(False)
        got: list[str] = []
        while True:
            try:
                got.extend(self.sock.recv(65536).decode().splitlines())
            except BlockingIOError:
                return got

    def close(self) -> None:
        self.sock.close()


def parse(lines: list[str], prefix: str) -> dict[str, list[tuple[float, str]]]:
    out: dict[str, list[tuple[float, str]]] = {}
    for line in lines:
        name, _, rest = line.partition(":")
        value, _, kind = rest.partition("|")
        if name.startswith(prefix):
            out.setdefault(name[len(prefix):], []).append((float(value), kind.split("|")[0]))
    return out


def test_a_harvest_run_emits_its_lineage_and_its_metrics(partner_env, repo, db, tmp_path: Path) -> None:
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
    try:
        done = subprocess.run([sys.executable, "-c", RUN], env=env, capture_output=True, text=True, timeout=600,
                              cwd=Path(__file__).resolve().parents[2])
        took = time.monotonic() - started
        assert done.returncode == 0, done.stderr[-4000:]
        states = json.loads(done.stdout.split("STATES=", 1)[1].splitlines()[0])
        assert set(states.values()) == {"success"}, states
        run_key = f"harvest_{PARTNER}/" + done.stdout.split("RUN_ID=", 1)[1].splitlines()[0]
        received = parse(statsd.lines(), "airflow.partner_harvest.")
    finally:
        statsd.close()

    # -- metrics: names from partner_harvest.metrics, values from harvest_runs and the simulator
    with psycopg.connect(db) as conn:
        row = conn.execute(
            "SELECT sum(fetched), sum(upserted), sum(unchanged), sum(purged), sum(quarantined) FROM harvest_runs "
            "WHERE partner_id = %s AND run_id = %s", (PARTNER, run_key)).fetchone()
    audit = dict(zip(metrics.APPLY_COUNTS, (int(v) for v in row)))
    assert audit["upserted"] == len(repo.live_identifiers()) > 0

    def total(key: str) -> float:
        name = metrics.metric(key).name(PARTNER)[len("partner_harvest."):]
        assert name in received, f"{name} not received; got {sorted(received)}"
        return sum(v for v, _ in received[name])

    for key, value in audit.items():
        assert total(key) == value, key
        assert {k for _, k in received[f"{key}.{PARTNER}"]} == {"c"}
    assert total("runs_applied") == 1
    assert total("warnings") == 0
    assert total("requests") == sim.requests_served - served_before  # every response, counted once
    assert total("response_bytes") > 400 * 100  # 400 records' XML, decoded
    (seconds, kind), = received[f"run_seconds.{PARTNER}"]
    assert kind == "ms" and 0 < seconds < took * 1000
    (lag, kind), = received[f"cursor_lag_seconds.{PARTNER}"]
    expected_lag = (datetime.now(timezone.utc) - repo.clock).total_seconds()
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
