-- Approval gates (docs/operator/approvals.md): a reconcile over its purge
-- limit, or a harvest that would shrink the partner's live set by more than its
-- max_shrink_fraction, stops before its apply and asks a person (Airflow's Required Actions).
-- One row per gated run: what the request showed, and what became of it.
CREATE TABLE IF NOT EXISTS approval_requests (
    partner_id     text        NOT NULL,
    run_id         text        NOT NULL,  -- <dag_id>/<Airflow run id>, as harvest_runs.run_id
    dag_id         text        NOT NULL,
    kind           text        NOT NULL CHECK (kind IN ('purge', 'shrink')),
    held           bigint      NOT NULL,
    removals       bigint      NOT NULL,
    absent         bigint      NOT NULL DEFAULT 0,
    limit_fraction double precision NOT NULL,
    sample         jsonb       NOT NULL DEFAULT '[]'::jsonb,
    epoch          integer,
    requested_at   timestamptz NOT NULL DEFAULT now(),
    state          text        NOT NULL DEFAULT 'pending'
                   CHECK (state IN ('pending', 'approved', 'applied', 'rejected', 'abandoned', 'refused')),
    decided_by     text,
    decided_at     timestamptz,
    note           text,
    PRIMARY KEY (partner_id, run_id)
);
CREATE INDEX IF NOT EXISTS approval_requests_pending ON approval_requests (partner_id, requested_at DESC);

COMMENT ON TABLE approval_requests IS
    'Runs stopped before their apply for a person''s decision (approval gates): a reconcile over max_purge_fraction, a harvest shrinking the live set by more than max_shrink_fraction. One row per gated run (docs/operator/approvals.md).';
COMMENT ON COLUMN approval_requests.partner_id IS 'The partner whose run waits.';
COMMENT ON COLUMN approval_requests.run_id IS 'The gated run, <dag_id>/<Airflow run id> as in harvest_runs.run_id.';
COMMENT ON COLUMN approval_requests.dag_id IS 'The DAG whose approval_gate task asks (harvest_<id> or reconcile_<id>).';
COMMENT ON COLUMN approval_requests.kind IS 'purge: a reconcile over max_purge_fraction; shrink: a harvest over max_shrink_fraction.';
COMMENT ON COLUMN approval_requests.held IS 'Records the partner held when the request was made.';
COMMENT ON COLUMN approval_requests.removals IS 'Held records the staged run would purge.';
COMMENT ON COLUMN approval_requests.absent IS 'Held records a full harvest did not return (the apply keeps them; a reconcile decides).';
COMMENT ON COLUMN approval_requests.limit_fraction IS 'The limit the run crossed (max_purge_fraction or max_shrink_fraction).';
COMMENT ON COLUMN approval_requests.sample IS 'A sample of what would go: [{identifier, title, why}], as the request showed it.';
COMMENT ON COLUMN approval_requests.epoch IS 'The partner''s epoch the run was planned at (partner_fences); a command since makes the approved apply refuse.';
COMMENT ON COLUMN approval_requests.requested_at IS 'When the request was made; a run of the partner applied after it makes the approved apply refuse.';
COMMENT ON COLUMN approval_requests.state IS 'pending, approved (apply under way), applied, rejected (by a person), abandoned (no answer by the deadline, registry approval_timeout_action=abandon) or refused (approved, but the partner changed during the wait).';
COMMENT ON COLUMN approval_requests.decided_by IS 'Who answered (Airflow user), or null for the deadline.';
COMMENT ON COLUMN approval_requests.decided_at IS 'When the answer (or the deadline, or the refusal) came.';
COMMENT ON COLUMN approval_requests.note IS 'One line on the outcome (the refusal''s cause, the timeout).';
