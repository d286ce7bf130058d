-- A sliced reconcile's sweep_ids instances are lanes, as a sliced harvest's (0047): each takes
-- the biggest planned slice left when it finishes one (store/reconcile_slices.claim). The lane
-- that took a slice, for its retries.
ALTER TABLE reconcile_slices ADD COLUMN IF NOT EXISTS lane smallint;
COMMENT ON COLUMN reconcile_slices.lane IS 'The sweep_ids instance (lane, from 1) that took this slice; its retries take it again.';
