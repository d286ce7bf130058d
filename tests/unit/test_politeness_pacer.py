"""The pacer's own rules, against a store that records what it was asked."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from partner_harvest.politeness import Pacer, PolitenessOptions, Reservation, endpoint_host


@dataclass
class FakeStore:
    penalty: float = 0.0
    wait: float = 0.0
    calls: list[tuple] = field(default_factory=list)

    def register(self, partner_id: str, host: str, delay_ms: int) -> None:
        self.calls.append(("register", partner_id, host, delay_ms))

    def reserve(self, host: str, delay_ms: int, healthy: int, recovery: float) -> Reservation:
        self.penalty *= (1 - recovery) ** healthy
        if self.penalty < 20:
            self.penalty = 0.0
        self.calls.append(("reserve", host, delay_ms, healthy))
        return Reservation(self.wait, max(delay_ms, self.penalty), self.penalty)

    def strain(self, host: str, step_ms: int, cap_ms: int) -> float:
        self.penalty = min(cap_ms, max(self.penalty * 2, step_ms))
        self.calls.append(("strain", host))
        return self.penalty

    def close(self) -> None:
        self.calls.append(("close",))


def _pacer(store: FakeStore, delay_ms: int = 0, **options: object) -> tuple[Pacer, list[float]]:
    slept: list[float] = []
    pacer = Pacer("museum", "repo.example.org", delay_ms, PolitenessOptions(**options), lambda: store,
                  sleep=slept.append)
    return pacer, slept


def test_the_host_key_is_the_host_name_alone() -> None:
    assert endpoint_host("https://Repo.Example.org:8443/oai/museum_a") == "repo.example.org"
    assert endpoint_host("http://repo.example.org/oai/museum_b") == "repo.example.org"


def test_no_delay_and_healthy_responses_never_open_the_store() -> None:
    store = FakeStore()
    opened = []
    pacer = Pacer("museum", "h", 0, PolitenessOptions(), lambda: opened.append(1) or store)  # type: ignore[func-returns-value]
    for _ in range(50):
        assert pacer.before() == 0.0
        pacer.after(0.05, 200)
    assert opened == [] and store.calls == []


def test_a_delay_reserves_every_request_and_sleeps_the_wait() -> None:
    store = FakeStore(wait=0.25)
    pacer, slept = _pacer(store, delay_ms=250)
    for _ in range(3):
        pacer.before()
        pacer.after(0.01, 200)
    assert [c[0] for c in store.calls] == ["register", "reserve", "reserve", "reserve"]
    assert slept == [0.25, 0.25, 0.25]
    assert [c[3] for c in store.calls[1:]] == [0, 1, 1]  # each healthy response rides on the next reservation


@pytest.mark.parametrize("status, seconds", [(503, 0.1), (429, 0.1), (None, 0.1), (200, 12.0)])
def test_a_strain_engages_the_pacer_until_the_back_off_wears_off(status: int | None, seconds: float) -> None:
    store = FakeStore()
    pacer, _ = _pacer(store, backoff_step=100, recovery=0.5)
    pacer.before()
    pacer.after(seconds, status)
    assert pacer.engaged and store.penalty == 100
    reservations = 0
    while pacer.engaged:
        pacer.before()
        pacer.after(0.01, 200)
        reservations += 1
    assert reservations == 4  # 100 -> 50 -> 25 -> 0 (below 20 ms), then it stops reserving
    assert [c[0] for c in store.calls].count("strain") == 1


def test_adaptive_off_never_strains() -> None:
    store = FakeStore()
    pacer, _ = _pacer(store, adaptive=False)
    pacer.before()
    pacer.after(0.1, 503)
    pacer.after(60.0, None)
    assert store.calls == [] and not pacer.engaged
