"""PostgreSQL side of a harvest: schema, staging, atomic apply and the run audit.

All SQL of the project lives in this package; every statement is parameterised and
scoped by ``partner_id`` so one partner's data can never touch another's.
"""

from partner_harvest.store.apply import ApplyResult, apply_run
from partner_harvest.store.db import connect
from partner_harvest.store.runs import RunRef, begin_run, fail_apply, fail_run, finish_harvest, record_check
from partner_harvest.store.schema import ensure_schema
from partner_harvest.store.staging import DEFAULT_MAX_RECORD_BYTES, StagingWriter

__all__ = [
    "DEFAULT_MAX_RECORD_BYTES",    "ApplyResult", "RunRef", "StagingWriter", "apply_run", "begin_run", "connect",
    "ensure_schema", "fail_apply", "fail_run", "finish_harvest", "record_check",
]
