"""``airflow dag-processor`` with a quieter idle loop, for deployments with many partners.

Airflow 3.3's dag-processor wakes once a second and, with nothing to parse, asks the
metadata database three things: are there callbacks to run, did the UI or API ask for a
parse, and are there warnings of inactive DAGs to delete. That loop is most of an idle
dag-processor's CPU, and it is not a setting. The manager documents those three calls as
overridable (``fetch_callbacks``, ``claim_priority_files``, ``purge_inactive_dag_warnings``):
this subclass asks again only every ``poll_interval`` seconds while the answers are empty,
and at once while there is work (a full batch of callbacks, a parse request). The rest of
the loop (heartbeat, changed DAG files, parses, timeouts) runs as before.

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


def main(argv: Sequence[str] | None = None) -> None:
    """Airflow's own ``dag-processor`` command, building this manager instead of its own."""
    from airflow.__main__ import main as airflow_main
    from airflow.cli.commands import dag_processor_command

    dag_processor_command.DagFileProcessorManager = QuietDagFileProcessorManager  # type: ignore[misc]
    sys.argv = ["airflow", "dag-processor", *(sys.argv[1:] if argv is None else argv)]
    airflow_main()


if __name__ == "__main__":
    main()
