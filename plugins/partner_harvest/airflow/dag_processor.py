"""``airflow dag-processor`` with a quieter idle loop, for deployments with many partners.

Airflow 3.3's dag-processor wakes once a second and, with nothing to parse, asks the
metadata database three things: are there callbacks to run, did the UI or API ask for a
parse, and are there warnings of inactive DAGs to delete. That loop is most of an idle
dag-processor's CPU, and it is not a setting. The manager documents those three calls as
overridable (``fetch_callbacks``, ``claim_priority_files``, ``purge_inactive_dag_warnings``):
this subclass asks again only every ``poll_interval`` seconds while the answers are empty,
and at once while there is work (a full batch of callbacks, a parse request).

The loop itself also wakes once a second, and each wake costs a little even when every
question is held back (the heartbeat's check, sorting the DAG files by mtime for an empty
queue). While nothing is parsing, queued or waiting to run, its wait on the parse
processes' sockets lasts until the next held-back question is due instead of a second. A
parse process that starts later registers its socket before the next wait, so parsing runs
at Airflow's own pace; the heartbeat then comes every ``poll_interval`` seconds at most,
kept under a third of ``[dag_processor] health_check_threshold``.

Run it in place of ``airflow dag-processor``, with the same arguments::

    python -m partner_harvest.airflow.dag_processor [--num-runs N] [...]

``[partner_harvest] dag_processor_poll_interval`` (seconds, default 10; 0 or less: Airflow's
own loop) sets the interval. A callback (a DAG's ``on_failure_callback``, the failure
alert of a task whose process died) or a "Reparse" from the UI then starts up to that many
seconds later.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import attrs
from airflow.configuration import conf
from airflow.dag_processing.manager import DagFileProcessorManager

DEFAULT_POLL_INTERVAL = 10.0
T = TypeVar("T")


def poll_interval() -> float:
    return conf.getfloat("partner_harvest", "dag_processor_poll_interval", fallback=DEFAULT_POLL_INTERVAL)


@attrs.define
class Throttle:
    """Lets a call through when ``interval`` has passed since the last empty answer; a call
    that found work is repeated at the next loop. ``clock`` is a monotonic clock."""

    interval: float
    clock: Callable[[], float] = time.monotonic
    next_at: float = 0.0

    def call(self, fetch: Callable[[], T], empty: Callable[[T], bool], nothing: T) -> T:
        now = self.clock()
        if self.interval > 0 and now < self.next_at:
            return nothing
        answer = fetch()
        self.next_at = now + self.interval if empty(answer) else 0.0
        return answer


def _throttle(manager: QuietDagFileProcessorManager) -> Throttle:
    return Throttle(manager.poll_interval)


@attrs.define(kw_only=True)
class QuietDagFileProcessorManager(DagFileProcessorManager):
    """Airflow's manager, asking the database for callbacks, parse requests and stale
    warnings only every ``poll_interval`` seconds while there are none."""

    poll_interval: float = attrs.field(factory=poll_interval)
    _callbacks: Throttle = attrs.field(init=False, default=attrs.Factory(_throttle, takes_self=True))
    _requests: Throttle = attrs.field(init=False, default=attrs.Factory(_throttle, takes_self=True))
    _warnings: Throttle = attrs.field(init=False, default=attrs.Factory(_throttle, takes_self=True))

    def fetch_callbacks(self) -> list[Any]:
        limit = self.max_callbacks_per_loop
        return self._callbacks.call(super().fetch_callbacks, lambda found: len(found) < limit, [])

    def claim_priority_files(self) -> list[Any]:
        return self._requests.call(super().claim_priority_files, lambda found: not found, [])

    def purge_inactive_dag_warnings(self) -> None:
        self._warnings.call(super().purge_inactive_dag_warnings, lambda _: True, None)

    def _service_processor_sockets(self, timeout: float | None = 1.0) -> None:
        # Airflow's loop waits here up to a second; the one private method this class overrides
        # (tests/unit/test_quiet_dag_processor.py fails if Airflow's loop stops calling it).
        super()._service_processor_sockets(timeout=self.idle_wait(timeout))

    def idle_wait(self, timeout: float | None) -> float | None:
        """How long the loop may wait: ``timeout`` while anything runs or waits, else until the
        next held-back question is due (at most the poll interval and the heartbeat bound)."""
        if timeout is None or self.poll_interval <= 0 or not self.idle():
            return timeout
        throttles = (self._callbacks, self._requests, self._warnings)
        due_in = min(throttle.next_at for throttle in throttles) - self._callbacks.clock()
        bound = min(self.poll_interval, heartbeat_bound())
        return max(timeout, min(due_in, bound))

    def idle(self) -> bool:
        return not (self._processors or self._file_queue or self._callback_to_execute)


def heartbeat_bound() -> float:
    """A third of the dag-processor's health-check threshold: a longer wait would let a
    healthy, idle dag-processor look dead to ``/health`` and ``airflow jobs check``."""
    return conf.getfloat("dag_processor", "health_check_threshold", fallback=30.0) / 3


def main(argv: Sequence[str] | None = None) -> None:
    """Airflow's own ``dag-processor`` command, building this manager instead of its own."""
    from airflow.__main__ import main as airflow_main
    from airflow.cli.commands import dag_processor_command

    dag_processor_command.DagFileProcessorManager = QuietDagFileProcessorManager  # type: ignore[misc]
    sys.argv = ["airflow", "dag-processor", *(sys.argv[1:] if argv is None else argv)]
    airflow_main()


if __name__ == "__main__":
    main()
