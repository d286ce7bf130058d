"""Celery pieces of an e2e stack: a Redis broker, gated OAI simulators and Celery workers.

Used by tests/e2e/test_celery_executor.py on top of conftest's ``airflow_stack`` (which
then runs the CeleryExecutor: see ``celery_env``). Each worker stands for a machine of
its own: its own AIRFLOW_HOME (logs, pid file), its own hostname in the task instances,
and ``kill`` SIGKILLs it with every process under it (the loss of that machine). What the
workers share with the scheduler is what a deployment shares: the code (dags/, plugins/),
the registry file, the Airflow and aggregation databases, the broker.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from include.simulators.oai_pmh import OaiSimulator, SimulatedRepository

from smtp_sink import free_loopback_port  # tests/e2e is on sys.path (pytest prepend mode)

ROOT = Path(__file__).resolve().parents[2]
SETTINGS_DIR = Path(__file__).resolve().parent / "celery_settings"  # airflow_local_settings, hostname callable
REDIS_SERVER = os.environ.get("HARVEST_REDIS_SERVER") or shutil.which("redis-server") or "/usr/bin/redis-server"
REDIS_START_TIMEOUT = 20.0
WORKER_READY_TIMEOUT = 120.0  # both workers answer a Celery ping
STOP_TIMEOUT = 20.0
HOLD_LIMIT = 300.0  # a held request gives up by itself: a failing test never leaves a thread behind
# A task whose worker died is failed this long after its last heartbeat (Airflow's default is
# 300 s); the task runners heartbeat every MIN_HEARTBEAT seconds, well inside it on a busy machine.
HEARTBEAT_TIMEOUT = 12
MIN_HEARTBEAT = 2


def _wait(probe: Any, timeout: float, what: str, diagnostics: Any = None) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        result = probe()
        if result:
            return result
        if time.monotonic() >= deadline:
            extra = f"\n{diagnostics()}" if diagnostics else ""
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}{extra}")
        time.sleep(0.2)


def _stop_groups(processes: list[subprocess.Popen]) -> None:
    """SIGTERM each process group, SIGKILL what outlives STOP_TIMEOUT."""
    for proc in processes:
        if proc.poll() is None:
            _signal_group(proc, signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT
    for proc in processes:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for proc in processes:  # pool processes and task runners may outlive their parent
        _signal_group(proc, signal.SIGKILL)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass


def _signal_group(proc: subprocess.Popen, sig: signal.Signals) -> None:
    try:
        os.killpg(proc.pid, sig)  # the group of a process this module started
    except ProcessLookupError:
        pass


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
        _wait(answers, REDIS_START_TIMEOUT, f"redis-server on 127.0.0.1:{port}")
        yield url
    finally:
        client.close()
        _stop_groups([proc])


# ---------------------------------------------------------------------- simulators
class GatedOaiSimulator(OaiSimulator):
    """The OAI-PMH simulator, plus a gate: from a chosen ListRecords request on, every one
    waits until released.

    Every chain reading from it then stands still in a known place while the test looks
    where each runs and kills a worker: no timing guess. With one chain per simulator the
    gate holds exactly one request; with several chains (slices) on one simulator, every
    chain that asks after the gate closed waits too.
    """

    def __init__(self, repo: SimulatedRepository) -> None:
        super().__init__(repo)
        self._gate = threading.Lock()
        self._hold_from: int | None = None
        self.list_requests = 0  # ListRecords requests answered or held, retries included
        self.held = threading.Event()  # set when the first request waits at the gate
        self._released = threading.Event()

    def hold_list_requests(self, from_number: int) -> None:
        """ListRecords request number ``from_number`` (counted from the start) and every
        later one wait for ``release``."""
        with self._gate:
            self._hold_from = from_number
            self.held.clear()
            self._released.clear()

    def release(self) -> None:
        with self._gate:
            self._hold_from = None
        self._released.set()

    def handle_oai(self, pairs: list[tuple[str, str]]) -> Any:
        if ("verb", "ListRecords") in pairs:
            with self._gate:
                self.list_requests += 1
                hold = self._hold_from is not None and self.list_requests >= self._hold_from
            if hold:
                self.held.set()
                self._released.wait(HOLD_LIMIT)
        return super().handle_oai(pairs)

    def pages(self) -> int:
        """Pages of one full ListRecords chain (deleted records are listed too)."""
        total = self.repo.counts()["total"]
        return -(-total // self.repo.page_size)


# ---------------------------------------------------------------------- Airflow
def celery_env(broker_url: str, concurrency: int) -> dict[str, str]:
    """What turns conftest's stack into a CeleryExecutor stack (for ``airflow_env_overrides``).

    The result backend is left unset: Airflow then uses its metadata database (PostgreSQL
    here, ``db+postgresql+psycopg://``), as in a production deployment.
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

    def kill(self) -> None:
        """The machine is gone: SIGKILL the worker and every process under it, nothing cleans up.

        Its process group is not enough: Airflow's supervisor puts each task runner in a
        group of its own, and a runner whose worker died keeps going (it harvested the
        rest of the chain in a first version of this test). So: stop the group, then
        kill the group and every descendant found under the worker.
        """
        import psutil

        _signal_group(self.process, signal.SIGSTOP)  # nothing forks while we look
        try:
            tree = psutil.Process(self.process.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            tree = []
        _signal_group(self.process, signal.SIGKILL)
        for child in tree:
            try:
                child.kill()
            except psutil.NoSuchProcess:
                pass
        self.process.wait(timeout=30)
        psutil.wait_procs(tree, timeout=30)

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

        _wait(all_answer, WORKER_READY_TIMEOUT, f"Celery workers {hostnames} to answer a ping",
              diagnostics=lambda: "\n".join(w.log_tail() for w in workers))
        yield workers
    finally:
        app.close()
        _stop_groups([worker.process for worker in workers])


@contextmanager
def worker_logs_on_failure(workers: list[CeleryWorker]) -> Iterator[None]:
    """On a failure, print the workers' logs and latest task logs (pytest shows them with
    the failure; conftest's report only knows the services and their AIRFLOW_HOME)."""
    try:
        yield
    except BaseException:
        from conftest import _log_event

        for worker in workers:
            print(worker.log_tail())
            logs = sorted((worker.home / "logs").rglob("attempt=*.log"), key=lambda p: p.stat().st_mtime)
            for path in logs[-4:]:
                lines = path.read_text(errors="replace").splitlines()[-25:]
                print(f"--- {path}:\n" + "\n".join(_log_event(line) for line in lines))
        raise
