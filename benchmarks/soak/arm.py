"""Faults inside the task processes a real scheduler launches (``--scheduler`` nights).

The soak writes one order to the file named by ``$HARVEST_SOAK_ARM_FILE``: ``{"dag_id",
"run_id", "moment", "action", "pg_label"}``. This module's listener, loaded into every task
process through the soak's plugins folder, acts when that run's task reaches the moment
(``running:<task>`` / ``success:<task>``; ``apply:audit``: inside the apply's transaction,
after its upsert and purge, before its audit and commit). The first process to rename the
order to ``<file>.fired`` acts; so the fault fires once, and the scheduler's retry of the
killed task meets none.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

from airflow.listeners import hookimpl
from airflow.plugins_manager import AirflowPlugin

ARM_ENV = "HARVEST_SOAK_ARM_FILE"


def _order() -> tuple[Path, dict[str, Any]] | None:
    path = os.environ.get(ARM_ENV)
    if not path:
        return None
    try:
        return Path(path), json.loads(Path(path).read_text())
    except (FileNotFoundError, ValueError):
        return None


def _claim(path: Path) -> bool:
    """Atomic: of all task processes (and retries), exactly one gets the order."""
    fired = path.with_name(path.name + ".fired")
    try:
        os.rename(path, fired)
    except FileNotFoundError:
        return False
    fired.write_text(json.dumps({"pid": os.getpid()}))
    return True


def act(action: str, pg_label: str) -> None:
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)  # the task process, as the OOM killer would
    elif action == "pg_restart":
        from include import embedded_pg

        embedded_pg.restart_immediately(pg_label)


def _arm_audit(path: Path, order: dict[str, Any]) -> None:
    from partner_harvest.store import apply

    audit = apply._audit

    def audit_then_act(*args: Any, **kwargs: Any) -> Any:
        apply._audit = audit
        if _claim(path):
            act(order["action"], order["pg_label"])
        return audit(*args, **kwargs)

    apply._audit = audit_then_act


def _maybe(when: str, ti: Any) -> None:
    found = _order()
    if not found:
        return
    path, order = found
    if (order.get("dag_id"), order.get("run_id")) != (ti.dag_id, ti.run_id):
        return
    if order["moment"] == "apply:audit":
        if when == "running" and ti.task_id == "apply_changes":
            _arm_audit(path, order)
    elif order["moment"] == f"{when}:{ti.task_id}" and _claim(path):
        act(order["action"], order["pg_label"])


class _Listener:
    @hookimpl
    def on_task_instance_running(self, previous_state: Any, task_instance: Any) -> None:
        _maybe("running", task_instance)

    @hookimpl
    def on_task_instance_success(self, previous_state: Any, task_instance: Any) -> None:
        _maybe("success", task_instance)


class SoakFaultsPlugin(AirflowPlugin):
    name = "soak_faults"
    listeners = [_Listener()]
