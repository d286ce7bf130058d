"""Celery pieces of an e2e stack: a Redis broker, a gated OAI simulator and Celery workers.

Used by tests/e2e/test_celery_executor.py on top of the e2e ``airflow_stack`` (tests/support/e2e_stack.py) (which
then runs the CeleryExecutor: see ``celery_env``). Each worker stands for a machine of
its own: its own AIRFLOW_HOME (logs, pid file), its own hostname in the task instances,
and ``kill`` SIGKILLs it with every process under it (the loss of that machine), or only
its process group, leaving its task runners alive as orphans. What the workers share with
the scheduler is what a deployment shares: the code (dags/, plugins/), the registry file,
the Airflow and aggregation databases, the broker.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from include.simulators.oai_pmh import OaiSimulator, SimulatedRepository
from tests.support.airflow_stack import DISCARD_WAIT, free_loopback_port, log_event, poll, signal_group, stop_groups

ROOT = Path(__file__).resolve().parents[2]
SETTINGS_DIR = ROOT / "tests" / "e2e" / "celery_settings"  # airflow_local_settings, hostname callable
REDIS_SERVER = os.environ.get("HARVEST_REDIS_SERVER") or shutil.which("redis-server") or "/usr/bin/redis-server"
REDIS_START_TIMEOUT = 20.0
WORKER_READY_TIMEOUT = 120.0  # both workers answer a Celery ping
HOLD_LIMIT = 300.0  # a held request gives up by itself: a failing test never leaves a thread behind
# A task whose worker died is failed this long after its last heartbeat (Airflow's default is
# 300 s); the task runners heartbeat every MIN_HEARTBEAT seconds, well inside it on a busy machine.
HEARTBEAT_TIMEOUT = 12
MIN_HEARTBEAT = 2


def _pgid(proc: Any) -> int | None:
    try:
        return os.getpgid(proc.pid)
    except ProcessLookupError:
        return None


def end_orphans(orphans: list[Any]) -> None:
    """SIGKILL what ``CeleryWorker.kill`` spared and is still running (test cleanup)."""
    import psutil

    for orphan in orphans:
        try:
            orphan.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(orphans, timeout=30)


# ---------------------------------------------------------------------- Redis
@contextmanager
def redis_broker(base: Path) -> Iterator[str]:
    """A private redis-server on a free loopback port, no persistence; yields its URL."""
    if not Path(REDIS_SERVER).exists():
        how = ("scripts/bootstrap.sh installs Debian's redis-server with apt-get when run as root"
               if shutil.which("apt-get") else "apt-get is not available on this machine")
        pytest.fail(f"no redis-server at {REDIS_SERVER} (set HARVEST_REDIS_SERVER to another binary): {how}. "
                    "The CeleryExecutor test needs a real Redis broker.")
    import redis

    port = free_loopback_port()
    log = base / "redis.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [REDIS_SERVER, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no",
             "--dir", str(base), "--protected-mode", "yes"],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
        )
    url = f"redis://127.0.0.1:{port}/0"
    client = redis.Redis.from_url(url, socket_timeout=1)

    def answers() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"redis-server exited with {proc.returncode}\n{log.read_text(errors='replace')}")
        try:
            return bool(client.ping())
        except redis.ConnectionError:
            return False

    try:
        poll(answers, REDIS_START_TIMEOUT, f"redis-server on 127.0.0.1:{port}")
        yield url
    finally:
        client.close()
        stop_groups([proc], DISCARD_WAIT)


# ---------------------------------------------------------------------- simulators
class GatedOaiSimulator(OaiSimulator):
    """The OAI-PMH simulator, plus a gate that stops every ListRecords chain at its second
    request (its first page answered, so staged, the next one in flight), chain by chain.

    Every chain reading from it then stands still in a known place while the test looks
    where each runs and kills a worker: no timing guess. A chain is told apart by its
    resumptionToken (``c<chain>!...``) and named by the ``until`` of its first request (a
    slice's upper bound, as its ``harvest_runs`` row holds it), so the test can let one
    slice's chain go on and keep another's held. Counts every list request by verb.
    """

    def __init__(self, repo: SimulatedRepository) -> None:
        super().__init__(repo)
        self._gate = threading.Condition()
        self._holding = False
        self._open: set[int] = set()  # chains let through while holding
        self._held: dict[int, int] = {}  # chain id -> requests waiting at the gate now
        self.chain_until: dict[int, str] = {}  # chain id -> the ``until`` its first request asked for
        self.list_requests = 0  # ListRecords requests answered or held, retries included
        self.identifier_requests = 0  # ListIdentifiers requests (the slice plan's count probes)

    def hold_continuations(self) -> None:
        """From now on, every ListRecords continuation of a chain not released waits."""
        with self._gate:
            self._holding = True
            self._open.clear()

    def release_chain(self, chain: int) -> None:
        """Let one chain go on (its waiting request and the rest of it)."""
        with self._gate:
            self._open.add(chain)
            self._gate.notify_all()

    def release(self) -> None:
        """Stop holding: every waiting request and every later one goes on."""
        with self._gate:
            self._holding = False
            self._gate.notify_all()

    def held_chains(self) -> dict[int, str]:
        """The chains waiting at the gate now, with their ``until``."""
        with self._gate:
            return {chain: self.chain_until.get(chain, "?") for chain, count in self._held.items() if count}

    def handle_oai(self, pairs: list[tuple[str, str]]) -> Any:
        args = dict(pairs)
        if args.get("verb") == "ListIdentifiers":
            with self._gate:
                self.identifier_requests += 1
        if args.get("verb") != "ListRecords":
            return super().handle_oai(pairs)
        with self._gate:
            self.list_requests += 1
        token = args.get("resumptionToken")
        if token is None:
            response = super().handle_oai(pairs)
            found = re.search(rb">c(\d+)!", response.body)
            if found:
                with self._gate:
                    self.chain_until[int(found.group(1))] = args.get("until", "")
            return response
        continued = re.match(r"c(\d+)!", token)
        chain = int(continued.group(1)) if continued else -1
        with self._gate:
            if self._holding and chain not in self._open:
                self._held[chain] = self._held.get(chain, 0) + 1
                self._gate.notify_all()
                self._gate.wait_for(lambda: not self._holding or chain in self._open, HOLD_LIMIT)
                self._held[chain] -= 1
        return super().handle_oai(pairs)

    def pages(self) -> int:
        """Pages of one full ListRecords chain (deleted records are listed too)."""
        total = self.repo.counts()["total"]
        return -(-total // self.repo.page_size)


# ---------------------------------------------------------------------- Airflow
def celery_env(broker_url: str, concurrency: int) -> dict[str, str]:
    """What turns the e2e stack into a CeleryExecutor stack (for ``airflow_env_overrides``).

    The result backend is left unset: Airflow then uses its metadata database (PostgreSQL
    here, ``db+postgresql+psycopg2://``), as in a production deployment.
    """
    return {
        "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
        "AIRFLOW__CELERY__BROKER_URL": broker_url,
        "AIRFLOW__CELERY__WORKER_CONCURRENCY": str(concurrency),
        "AIRFLOW__CELERY__SYNC_PARALLELISM": "1",
        "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": str(HEARTBEAT_TIMEOUT),
        "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": "1",
        "AIRFLOW__WORKERS__MIN_HEARTBEAT_INTERVAL": str(MIN_HEARTBEAT),
        # The cluster policy of celery_settings/airflow_local_settings.py (1 s retries) in every service.
        "PYTHONPATH": os.pathsep.join([str(SETTINGS_DIR), str(ROOT / "plugins"), str(ROOT)]),
    }


@dataclass
class CeleryWorker:
    """One ``airflow celery worker``: a machine of its own as far as Airflow can tell."""

    hostname: str  # what the task instances record (``[core] hostname_callable``)
    home: Path
    log: Path
    process: subprocess.Popen

    @property
    def node(self) -> str:
        return f"celery@{self.hostname}"

    def kill(self, spare_task_runners: bool = False) -> list[Any]:
        """The worker dies by SIGKILL: nothing of it cleans up. Returns the processes left alive.

        Its process group is not everything: Airflow's supervisor puts each task runner in a
        group of its own, and a runner whose worker died keeps going. By default every
        descendant found under the worker is killed too (the machine is gone). With
        ``spare_task_runners`` only the worker's own group is (``kill -9 -<pgid>``): its task
        runners live on as orphans, still harvesting, and are returned (the caller ends
        them with ``end_orphans``).
        """
        import psutil

        signal_group(self.process, signal.SIGSTOP)  # nothing forks while we look
        try:
            tree = psutil.Process(self.process.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            tree = []
        group = os.getpgid(self.process.pid)
        spared = [p for p in tree if spare_task_runners and _pgid(p) not in (None, group)]
        signal_group(self.process, signal.SIGKILL)
        for child in tree:
            if child in spared:
                continue
            try:
                child.kill()
            except psutil.NoSuchProcess:
                pass
        self.process.wait(timeout=30)
        psutil.wait_procs([p for p in tree if p not in spared], timeout=30)
        return spared

    def log_tail(self, lines: int = 60) -> str:
        text = self.log.read_text(errors="replace").splitlines()[-lines:] if self.log.exists() else []
        return f"--- worker {self.hostname} ({self.log}):\n" + "\n".join(text)


def start_worker(env: dict[str, str], base: Path, hostname: str, concurrency: int) -> CeleryWorker:
    home = base / hostname
    home.mkdir()
    worker_env = {
        **env,
        "AIRFLOW_HOME": str(home),
        "E2E_WORKER_HOSTNAME": hostname,
        "AIRFLOW__CORE__HOSTNAME_CALLABLE": "e2e_worker_host.hostname",
        "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_loopback_port()),
    }
    log = base / f"worker-{hostname}.log"
    command = [sys.executable, "-m", "airflow", "celery", "worker", "--celery-hostname", f"celery@{hostname}",
               "--concurrency", str(concurrency), "--without-mingle", "--without-gossip"]
    with log.open("wb") as out:
        process = subprocess.Popen(command, env=worker_env, cwd=home, stdout=out, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True)
    return CeleryWorker(hostname=hostname, home=home, log=log, process=process)


@contextmanager
def celery_workers(env: dict[str, str], base: Path, hostnames: tuple[str, ...], concurrency: int,
                   broker_url: str) -> Iterator[list[CeleryWorker]]:
    """Start the workers together; yield once every one answers a Celery ping."""
    from celery import Celery

    workers: list[CeleryWorker] = []
    app = Celery("e2e-probe", broker=broker_url)
    try:
        for hostname in hostnames:
            workers.append(start_worker(env, base, hostname, concurrency))

        def all_answer() -> bool:
            for worker in workers:
                if worker.process.poll() is not None:
                    raise RuntimeError(f"worker {worker.hostname} exited with {worker.process.returncode}\n"
                                       f"{worker.log_tail()}")
            replies = app.control.ping(timeout=1.0)
            answered = {name for reply in replies for name in reply}
            return answered >= {worker.node for worker in workers}

        poll(all_answer, WORKER_READY_TIMEOUT, f"Celery workers {hostnames} to answer a ping",
              diagnostics=lambda: "\n".join(w.log_tail() for w in workers))
        yield workers
    finally:
        app.close()
        stop_groups([worker.process for worker in workers], DISCARD_WAIT)


@contextmanager
def worker_logs_on_failure(workers: list[CeleryWorker]) -> Iterator[None]:
    """On a failure, print the workers' logs and latest task logs (pytest shows them with
    the failure; the e2e report only knows the services and their AIRFLOW_HOME)."""
    try:
        yield
    except BaseException:
        for worker in workers:
            print(worker.log_tail())
            logs = sorted((worker.home / "logs").rglob("attempt=*.log"), key=lambda p: p.stat().st_mtime)
            for path in logs[-4:]:
                lines = path.read_text(errors="replace").splitlines()[-25:]
                print(f"--- {path}:\n" + "\n".join(log_event(line) for line in lines))
        raise
