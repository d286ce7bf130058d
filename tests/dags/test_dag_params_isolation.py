"""A run's conf must not become another DAG's default in the same process.

Airflow's ``process_params`` merges a run's conf into the task's Params, and for a task with
no Params of its own (the approval gate, a HITL operator) into the DAG's Param objects
themselves (``Param.resolve(value)`` keeps the value). With Param objects shared between DAGs
(module-level dicts), one ``dag.test(run_conf=...)``'s ``allow_mass_purge: true`` or
``mode: full`` became the default of every DAG built afterwards in the process: a later
reconcile would purge without asking."""

from __future__ import annotations

import pytest

from partner_harvest.registry import load_partners

pytestmark = pytest.mark.airflow


def test_a_run_conf_does_not_leak_into_other_dags_params() -> None:
    from airflow.sdk.definitions.param import process_params

    from partner_harvest.airflow.dag_factory import build_harvest_dag, build_reconcile_dag

    partner = load_partners()[0]
    for build, conf, key, default in (
        (build_reconcile_dag, {"allow_mass_purge": True}, "allow_mass_purge", False),
        (build_harvest_dag, {"mode": "full"}, "mode", "incremental"),
    ):
        ran = build(partner)  # what the gate's task runner does with the run's conf
        assert process_params(ran, ran.get_task("approval_gate"), conf, suppress_exception=False)[key] == conf[key]
        assert build(partner).params.get_param(key).value == default, f"{key} leaked from a run's conf"
