"""Each protocol's ``stack`` (what airflow/preload.py imports before Airflow forks) is the
module its ``build`` takes the adapter from: preloading another module would save nothing."""

from __future__ import annotations

import inspect

from partner_harvest.protocols import specs


def test_each_protocols_stack_is_the_module_its_build_imports_its_adapter_from() -> None:
    for spec in specs():
        assert f"from {spec.stack} import" in inspect.getsource(spec.build), (spec.name, spec.stack)
