"""A real scheduler, dag processor and LocalExecutor: a partner whose pool was never
created does not wait silently; its run deadline sends an alert email.

Uses the module's own ``airflow_stack`` (started for this module) and adds a partner to
its registry at run time, without creating the partner's pool.
"""

from __future__ import annotations

import pytest
from conftest import AirflowStack, _dag_parsed  # pytest (prepend mode) puts tests/e2e on sys.path

pytestmark = pytest.mark.e2e
POOLLESS = "e2epoolless"


def test_a_run_whose_pool_is_missing_alerts_at_its_deadline(airflow_stack: AirflowStack) -> None:
    stack = airflow_stack
    dag_id = f"harvest_{POOLLESS}"
    original = stack.registry.read_text(encoding="utf-8")
    stack.registry.write_text(
        original + f"  - {{id: {POOLLESS}, protocol: oai-pmh, conn_id: partner_{stack.museum}, "
        "run_deadline: 1m}\n", encoding="utf-8")
    try:
        stack.poll(lambda: _dag_parsed(stack, dag_id), 120, f"DAG {dag_id} to be parsed")
        assert stack.http.get(f"{stack.base_url}/api/v2/pools/partner_{POOLLESS}", timeout=30).status_code == 404

        run = stack.trigger(dag_id, {"mode": "incremental"})

        def overdue(mail) -> bool:
            return "not finished" in mail.subject and run["dag_run_id"] in mail.text

        mail = stack.sink.wait_for(overdue, timeout=240)
        assert mail is not None, (f"no overdue alert; received {[m.subject for m in stack.sink.messages]}\n"
                                  f"{stack.diagnostics()}")
        assert f"pool partner_{POOLLESS} exists" in mail.text and dag_id in mail.subject
        # Nothing ran: the tasks still wait for the pool.
        states = stack.task_states(dag_id, run["dag_run_id"])
        assert states.get("freeze_window") in (None, "scheduled"), states
    finally:
        stack.registry.write_text(original, encoding="utf-8")
