"""The pieces of ``--scheduler`` nights that need no Airflow: the per-kind plan meets every
fault kind on a night it can fire on, and an armed fault is claimed by one task process only."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.soak.driver import FAST_WAITS, PARTNERS, Soak, per_kind_plan, registry_yaml
from benchmarks.soak.faults import FAULTS


def test_per_kind_plan_meets_every_kind_once_on_a_night_it_can_fire() -> None:
    plan = per_kind_plan(list(PARTNERS))
    kinds = [k for k in plan.values() if k != "none"]
    assert sorted(kinds) == sorted(k for k, f in FAULTS.items() if not f.known_gap)
    for (partner, night), kind in plan.items():
        if kind == "none":
            continue
        fault = FAULTS[kind]
        assert PARTNERS[partner].protocol in fault.protocols, (partner, kind)
        if fault.full_load_only or fault.where == "page" and fault.action != "pause" and "oai-pmh" in fault.protocols:
            assert night == 1, (partner, night, kind)  # a full load: pages enough for the fault's page
        if fault.incremental_only or fault.where == "before":
            assert night > 1, (partner, night, kind)
    for partner in {p for p, _ in plan}:  # no holes: every night up to the last is planned
        nights = sorted(n for p, n in plan if p == partner)
        assert nights == list(range(1, len(nights) + 1))
    assert "clock_behind_cursor" in per_kind_plan(list(PARTNERS), known_gaps=True).values()
    for (partner, _), kind in plan.items():
        assert PARTNERS[partner].reconciled or not FAULTS[kind].reconcile_only if kind != "none" else True
    on_scheduler = set(per_kind_plan(list(PARTNERS), scheduler=True).values())
    assert not {k for k in on_scheduler if k != "none" and FAULTS[k].dag_test_only}
    assert {k for k in kinds if FAULTS[k].dag_test_only} == {k for k in FAULTS if k.startswith("pause_")
                                                             or k.endswith("_in_retry_wait")
                                                             or k.endswith("_quiet_outage")
                                                             or k.endswith("_after_quiet_night")}


def test_an_armed_fault_is_claimed_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("airflow")
    from benchmarks.soak import arm

    order = tmp_path / "armed.json"
    order.write_text(json.dumps({"dag_id": "d", "run_id": "r", "moment": "running:t", "action": "", "pg_label": "x"}))
    monkeypatch.setenv(arm.ARM_ENV, str(order))
    assert arm._order() == (order, json.loads(order.read_text()))
    assert arm._claim(order) is True
    assert arm._claim(order) is False  # a retry of the killed task meets no fault
    assert arm._order() is None
    assert json.loads(order.with_name("armed.json.fired").read_text())["pid"] > 0


@pytest.mark.parametrize("plan", [{("soak_persistent", 1): "kill_mid_page", ("soak_persistent", 2): "pg_restart_mid_apply"},
                                  {("soak_persistent", 1): "kill_mid_page"}])  # night 2 unplanned: a seeded pick
def test_airflow_metadata_beside_the_aggregation_database_refuses_nights_that_may_restart_it(
        tmp_path: Path, plan: dict) -> None:
    soak = Soak(seed=1, nights=2, partners=["soak_persistent"], conninfo="dbname=unused", pg_label="test",
                workdir=tmp_path, plan=plan, scheduler=True, airflow_metadata=("dbname=unused", "template"))
    with pytest.raises(ValueError, match="soak_persistent night 2"):
        soak._check_no_restart_meets_airflow()
    soak.plan[("soak_persistent", 2)] = "kill_mid_apply"
    soak._check_no_restart_meets_airflow()  # kills only: no error


def test_fast_waits_shorten_only_the_waits_of_a_valid_registry(tmp_path: Path) -> None:
    from partner_harvest.registry import load_partners

    path = tmp_path / "partners.yaml"
    path.write_text(registry_yaml([PARTNERS["soak_persistent"], PARTNERS["soak_sierra"]], FAST_WAITS))
    fast = {p.id: p for p in load_partners(path)}
    path.write_text(registry_yaml([PARTNERS["soak_persistent"], PARTNERS["soak_sierra"]]))
    default = {p.id: p for p in load_partners(path)}
    fast_delay, default_delay = fast["soak_sierra"].retry_delay, default["soak_sierra"].retry_delay
    assert fast_delay and default_delay and fast_delay.total_seconds() == 1 < default_delay.total_seconds()
    assert fast["soak_sierra"].options.sierra.model_dump(exclude_unset=True) == {"server_error_backoff": 0.01}
    assert not default["soak_sierra"].options.sierra.model_fields_set  # the client's own 2 s, 4 s for the soak command
    assert fast["soak_sierra"].retries == default["soak_sierra"].retries
    assert fast["soak_persistent"].options == default["soak_persistent"].options
