"""The OAI-PMH simulator's per-response delay and its count of concurrent requests.

A benchmark shows with these that a pool of N never lets more than N requests reach the
partner at once, and that a pipelined chain keeps one request in flight while it works.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import requests

from include.simulators.oai_pmh import OaiSimulator, SimulatedRepository

ROOT = Path(__file__).resolve().parents[2]

IDENTIFY = {"verb": "Identify"}


def _get_in_threads(url: str, count: int) -> tuple[list[threading.Thread], list[int]]:
    statuses: list[int] = []

    def get() -> None:
        with requests.Session() as session:
            statuses.append(session.get(url, params=IDENTIFY, timeout=30).status_code)

    threads = [threading.Thread(target=get) for _ in range(count)]
    for thread in threads:
        thread.start()
    return threads, statuses


def test_concurrent_requests_are_served_side_by_side_and_counted() -> None:
    """Four requests held by a long delay are all in flight at once (a threading server);
    lowering the delay releases them, and the high-water mark stays at four."""
    with OaiSimulator(SimulatedRepository(records=10), response_delay_ms=60_000) as sim:
        threads, statuses = _get_in_threads(sim.base_url, 4)
        try:
            assert sim.wait_in_flight(4, timeout=10), f"only {sim.in_flight} in flight"
        finally:
            sim.set_response_delay(0)
            for thread in threads:
                thread.join(timeout=10)
        assert statuses == [200] * 4
        assert sim.wait_idle(timeout=10), f"{sim.in_flight} still in flight"
        assert sim.max_in_flight == 4
        sim.reset_in_flight()
        assert sim.max_in_flight == 0
        with requests.Session() as session:
            assert session.get(sim.base_url, params=IDENTIFY).status_code == 200
        assert sim.wait_idle(timeout=10)
        assert sim.max_in_flight == 1


def test_a_client_holds_its_answer_before_the_server_counts_the_request_done(monkeypatch: pytest.MonkeyPatch) -> None:
    """Why tests wait for ``wait_idle`` instead of reading ``in_flight`` when their client
    returns: the server's thread counts the request done only after writing the answer.
    Here that thread is held just after writing, as a busy machine may hold it (the race
    that once failed the test above)."""
    with OaiSimulator(SimulatedRepository(records=10)) as sim:
        serving = sim._serving
        written, release = threading.Event(), threading.Event()

        @contextmanager
        def held_after_writing() -> Iterator[None]:
            with serving():
                yield
                written.set()
                assert release.wait(10)

        monkeypatch.setattr(sim, "_serving", held_after_writing)
        with requests.Session() as session:
            assert session.get(sim.base_url, params=IDENTIFY, timeout=10).status_code == 200
        assert written.wait(10)
        assert sim.in_flight == 1  # the client is done, the server not yet
        assert not sim.wait_idle(timeout=0.05)
        release.set()
        assert sim.wait_idle(timeout=10) and sim.in_flight == 0


def test_delay_and_counter_over_the_control_api() -> None:
    with OaiSimulator(SimulatedRepository(records=10)) as sim, requests.Session() as session:
        control = sim.base_url.replace("/oai", "/_control/")
        assert session.post(control + "response_delay", json={"ms": 150}).json() == {"ok": True}
        started = time.monotonic()
        assert session.get(sim.base_url, params=IDENTIFY).status_code == 200
        assert time.monotonic() - started >= 0.15
        report = session.get(control + "in_flight").json()
        assert report == {"in_flight": 0, "max_in_flight": 1, "response_delay_ms": 150.0}
        assert session.get(control + "state").json()["max_in_flight"] == 1
        assert session.post(control + "reset_in_flight", json={}).json()["max_in_flight"] == 0
        assert session.post(control + "response_delay", json={"ms": -1}).status_code == 400
        assert session.post(control + "response_delay", json={"ms": 0}).json() == {"ok": True}
        session.get(control + "state")  # control requests are neither delayed nor counted
        assert session.get(control + "in_flight").json()["max_in_flight"] == 0


def test_delay_at_start_from_the_command_line() -> None:
    from include.simulators.process import control, simulator_process

    with simulator_process("oai_pmh", "--records", "10", "--response-delay-ms", "120") as url:
        assert control(url, "in_flight")["response_delay_ms"] == 120.0
        started = time.monotonic()
        assert requests.get(url, params=IDENTIFY, timeout=30).status_code == 200
        assert time.monotonic() - started >= 0.12


def test_negative_delay_is_refused() -> None:
    with pytest.raises(ValueError):
        OaiSimulator(SimulatedRepository(records=1), response_delay_ms=-5)
