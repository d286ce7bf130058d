-- An approval stays valid while runs that changed nothing, or only other records, apply
-- during the wait (docs/operator/approvals.md): the column's description says so.
COMMENT ON COLUMN approval_requests.requested_at IS 'When the request was made; a run of the partner applied after it that changed a record the gated run would purge makes the approved apply refuse.';
