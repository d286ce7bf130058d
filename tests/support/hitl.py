"""Answering a Human-in-the-loop request during a ``dag.test()`` run in this process.

``dag.test()`` keeps a run whose task waits in ``awaiting_input`` alive until a response is
recorded from outside (airflow/sdk/definitions/dag.py). This is what the REST API's
``PATCH .../hitlDetails`` does (airflow/api_fastapi/core_api/routes/public/hitl.py): record the
response on the request and resume the parked task; from a thread, against the same
metadata database.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any


class Responder:
    """Answers the first request of ``task_id`` with ``option``; ``before`` runs first (e.g. an
    operator's command during the wait). ``seen`` holds the request's subject and body."""

    def __init__(self, task_id: str, option: str, user: str = "ada", before: Callable[[], None] | None = None,
                 timeout: float = 90.0) -> None:
        self.task_id, self.option, self.user, self.before, self.timeout = task_id, option, user, before, timeout
        self.seen: dict[str, Any] = {}
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"hitl-{task_id}", daemon=True)

    def __enter__(self) -> Responder:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._thread.join(timeout=self.timeout)
        if self.error is not None and exc[0] is None:
            raise self.error

    def _run(self) -> None:
        try:
            self._answer()
        except BaseException as exc:  # surfaced in __exit__
            self.error = exc

    def _answer(self) -> None:
        from airflow.models.hitl import HITLDetail
        from airflow.models.taskinstance import TaskInstance
        from airflow.models.trigger import handle_event_submit
        from airflow.sdk import timezone
        from airflow.triggers.base import TriggerEvent
        from airflow.utils.session import create_session
        from airflow.utils.state import TaskInstanceState
        from sqlalchemy import select

        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            with create_session() as session:
                ti = session.scalar(select(TaskInstance).where(
                    TaskInstance.task_id == self.task_id, TaskInstance.state == TaskInstanceState.AWAITING_INPUT))
                detail = session.get(HITLDetail, ti.id) if ti is not None else None
                if ti is not None and detail is not None:
                    self.seen = {"subject": detail.subject, "body": detail.body, "options": detail.options,
                                 "state": ti.state}
                    if self.before is not None:
                        self.before()
                    detail.responded_by = {"id": self.user, "name": self.user}  # an HITLUser
                    detail.responded_at = timezone.utcnow()
                    detail.chosen_options = [self.option]
                    detail.params_input = {}
                    session.add(detail)
                    handle_event_submit(TriggerEvent(detail.as_resume_event_payload()), task_instance=ti,
                                        session=session)
                    return
            time.sleep(0.2)
        raise TimeoutError(f"no {self.task_id} waited for input within {self.timeout} s")
