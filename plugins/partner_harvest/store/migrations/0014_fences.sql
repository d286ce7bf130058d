-- Fences. Per partner: the last lease token handed out (it only grows, never
-- reset, not even by `forget`) and the epoch, which every operator command that changes
-- the partner's state bumps. A write a lease protects locks this row FOR KEY SHARE and
-- checks both in its own transaction (store/fences.py); a command's bump (FOR UPDATE)
-- waits for such writes to commit, and the writes after it see the new epoch.
CREATE TABLE IF NOT EXISTS partner_fences (
    partner_id     text        PRIMARY KEY,
    last_token     bigint      NOT NULL DEFAULT 0,
    epoch          bigint      NOT NULL DEFAULT 0,
    epoch_command  text,                      -- the command that set the epoch, e.g. 'forget'
    epoch_at       timestamptz
);

-- The token of the lease's tenure: given when the row is created, kept while it is renewed
-- or joined by the run's other tasks; a lapsed lease taken again gets a new one.
ALTER TABLE partner_leases ADD COLUMN IF NOT EXISTS token bigint;

-- The payload bytes each channel staged (store/staging.py): a run's sum over its channels
-- and slices may not pass the partner's options.limits.max_run_bytes.
ALTER TABLE harvest_runs ADD COLUMN IF NOT EXISTS staged_bytes bigint NOT NULL DEFAULT 0;
