-- The partner's own clock when each window was frozen. A partner clock behind our cursor
-- (a reset, a failover to a server with another clock) stamps its changes before the
-- cursor: the next window must start from what the partner's timeline really covered,
-- min(until, partner_clock), while the cursor Variable itself never moves backwards.
ALTER TABLE harvest_runs ADD COLUMN IF NOT EXISTS partner_clock timestamptz;
