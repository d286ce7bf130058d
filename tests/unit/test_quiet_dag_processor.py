"""The dag-processor's idle loop asks the database for callbacks, parse requests and
stale warnings every poll interval while there are none, and at once while there is work."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from typing import Any

import pytest
from airflow.dag_processing.manager import DagFileProcessorManager

from partner_harvest.airflow.dag_processor import QuietDagFileProcessorManager, Throttle

NOTHING: list[str] = []  # what a held-back call answers


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_an_empty_answer_holds_the_next_call_for_the_interval() -> None:
    clock, asked = Clock(), []
    throttle = Throttle(10.0, clock)

    def fetch() -> list[str]:
        asked.append(clock.now)
        return []

    for now in (100.0, 101.0, 109.9, 110.0, 115.0, 120.5):
        clock.now = now
        assert throttle.call(fetch, lambda found: not found, NOTHING) == []
    assert asked == [100.0, 110.0, 120.5]


def test_an_answer_with_work_is_asked_again_at_the_next_loop() -> None:
    clock, answers = Clock(), iter([["a"], ["b"], [], ["c"]])
    throttle = Throttle(10.0, clock)
    seen: list[list[str]] = []
    for now in (100.0, 100.5, 101.0, 101.5, 111.0):
        clock.now = now
        seen.append(throttle.call(lambda: next(answers), lambda found: not found, NOTHING))
    assert seen == [["a"], ["b"], [], [], ["c"]]


def test_an_interval_of_zero_asks_every_time() -> None:
    clock, calls = Clock(), [0]

    def fetch() -> list[str]:
        calls[0] += 1
        return []

    throttle = Throttle(0.0, clock)
    for _ in range(5):
        throttle.call(fetch, lambda found: not found, NOTHING)
    assert calls[0] == 5


@pytest.fixture
def database(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """Airflow's three database calls, replaced by counters with scripted answers."""
    state: dict[str, Any] = {"callbacks": [], "requests": [], "asked": {"callbacks": 0, "requests": 0, "purges": 0}}

    def fetch_callbacks(self: DagFileProcessorManager) -> list[Any]:
        state["asked"]["callbacks"] += 1
        return state["callbacks"].pop(0) if state["callbacks"] else []

    def claim_priority_files(self: DagFileProcessorManager) -> list[Any]:
        state["asked"]["requests"] += 1
        return state["requests"].pop(0) if state["requests"] else []

    def purge(self: DagFileProcessorManager) -> None:
        state["asked"]["purges"] += 1

    monkeypatch.setattr(DagFileProcessorManager, "fetch_callbacks", fetch_callbacks)
    monkeypatch.setattr(DagFileProcessorManager, "claim_priority_files", claim_priority_files)
    monkeypatch.setattr(DagFileProcessorManager, "purge_inactive_dag_warnings", purge)
    yield state


def loops(manager: QuietDagFileProcessorManager, clock: Clock, seconds: int) -> list[Any]:
    """One idle loop a second, as Airflow's manager runs them; what the callbacks fetch found."""
    found = []
    for _ in range(seconds):
        found += manager.fetch_callbacks()
        manager.claim_priority_files()
        manager.purge_inactive_dag_warnings()
        clock.now += 1.0
    return found


def quiet_manager(clock: Clock, interval: float) -> QuietDagFileProcessorManager:
    manager = QuietDagFileProcessorManager(max_runs=1, poll_interval=interval)
    for throttle in (manager._callbacks, manager._requests, manager._warnings):
        throttle.clock = clock
    return manager


def test_an_idle_minute_asks_the_database_six_times_not_sixty(database: dict[str, Any]) -> None:
    clock = Clock()
    loops(quiet_manager(clock, 10.0), clock, 60)
    assert database["asked"] == {"callbacks": 6, "requests": 6, "purges": 6}


def test_a_full_batch_of_callbacks_is_followed_by_another_fetch_at_once(database: dict[str, Any]) -> None:
    clock = Clock()
    manager = quiet_manager(clock, 10.0)
    batch = manager.max_callbacks_per_loop
    database["callbacks"] = [[f"a{i}" for i in range(batch)], [f"b{i}" for i in range(batch)], ["c0"]]
    found = loops(manager, clock, 3)
    assert len(found) == 2 * batch + 1  # three loops, three fetches: a backlog drains at Airflow's pace
    assert database["asked"]["callbacks"] == 3
    loops(manager, clock, 9)  # the last answer was short: the next fetch waits the interval...
    assert database["asked"]["callbacks"] == 3
    loops(manager, clock, 1)  # ...of 10 s
    assert database["asked"]["callbacks"] == 4


class Selector:
    """The manager's selector, recording how long each wait was allowed to last."""

    def __init__(self) -> None:
        self.timeouts: list[float | None] = []

    def select(self, timeout: float | None = None) -> list[Any]:
        self.timeouts.append(timeout)
        return []


def idle_manager(clock: Clock, interval: float) -> tuple[QuietDagFileProcessorManager, Selector]:
    manager, selector = quiet_manager(clock, interval), Selector()
    manager.selector = selector  # type: ignore[assignment]
    return manager, selector


def test_an_idle_loop_waits_until_the_next_question_is_due(database: dict[str, Any]) -> None:
    clock = Clock()
    manager, selector = idle_manager(clock, 10.0)
    loops(manager, clock, 1)  # asked at 100: the next questions are due at 110
    clock.now = 101.5
    manager._service_processor_sockets(timeout=0.98)
    assert selector.timeouts == [pytest.approx(8.5)]


def test_a_loop_with_work_waits_as_airflow_does(database: dict[str, Any]) -> None:
    clock = Clock()
    manager, selector = idle_manager(clock, 10.0)
    loops(manager, clock, 1)
    manager._file_queue["a file"] = None  # type: ignore[index]
    manager._service_processor_sockets(timeout=0.98)
    manager._file_queue.clear()
    manager._processors["a file"] = object()  # type: ignore[index,assignment]
    manager._service_processor_sockets(timeout=0.5)
    manager._processors.clear()
    manager._callback_to_execute["a file"] = ["a callback"]  # type: ignore[index,list-item]
    manager._service_processor_sockets(timeout=0.0)
    assert selector.timeouts == [0.98, 0.5, 0.0]


def test_a_question_that_found_work_is_asked_at_the_next_second(database: dict[str, Any]) -> None:
    clock = Clock()
    manager, selector = idle_manager(clock, 10.0)
    database["requests"] = [["a parse request"]]
    loops(manager, clock, 1)
    manager._service_processor_sockets(timeout=0.98)
    assert selector.timeouts == [0.98]


def test_the_idle_wait_stays_under_a_third_of_the_health_check_threshold(
    database: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW__DAG_PROCESSOR__HEALTH_CHECK_THRESHOLD", "12")
    clock = Clock()
    manager, selector = idle_manager(clock, 60.0)
    loops(manager, clock, 1)
    manager._service_processor_sockets(timeout=0.98)
    assert selector.timeouts == [pytest.approx(4.0)]


def test_airflow_loop_still_waits_through_the_overridden_method() -> None:
    # An Airflow upgrade that renames the wait would silently bring back the one-second loop.
    source = inspect.getsource(DagFileProcessorManager._run_parsing_loop)
    assert "self._service_processor_sockets(timeout=poll_time)" in source
