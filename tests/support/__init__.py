"""What the tests (and the benchmarks) share instead of importing each other's helpers.

- ``partners``: partners built from registry-shaped entries through the registry's own
  loading path, and the fast-HTTP options a test partner runs with.
- ``db``: what the aggregation holds (``held``).
- ``harness``: a protocol simulator on loopback with a partner pointed at it, run through
  ``partner_harvest.run`` (the DAG's steps without Airflow).
- ``airflow_stack``: one starter of a real Airflow (api-server, scheduler, dag-processor,
  optionally the triggerer) on loopback, for the e2e tests, the soak and the local UI.

docs/design/testing.md says which tier runs what.
"""
