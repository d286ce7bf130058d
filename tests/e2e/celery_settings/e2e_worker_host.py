"""``[core] hostname_callable`` of the Celery e2e workers: each worker stands for a machine.

Both workers run on this machine, so the FQDN would be the same for both; the task
instances' ``hostname`` must tell them apart.
"""

from __future__ import annotations

import os


def hostname() -> str:
    return os.environ["E2E_WORKER_HOSTNAME"]
