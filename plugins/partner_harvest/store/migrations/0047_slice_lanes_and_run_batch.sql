-- A sliced run's harvest_changes instances are lanes: each takes the biggest planned slice
-- left when it finishes one (store/slices.claim). The lane that took a slice, for its retries.
ALTER TABLE harvest_runs ADD COLUMN IF NOT EXISTS lane smallint;
COMMENT ON COLUMN harvest_runs.lane IS 'A sliced run: the harvest_changes instance (lane, from 1) that took this slice; its retries take it again.';

-- What the apply merges, prepared while the run's other slices still harvest (store/run_batch.py):
-- per identifier the newest version a harvested slice staged. Derived from staging, never read
-- by anyone but the run's apply; UNLOGGED like staging (a crash empties it: the apply then
-- builds it again from staging).
CREATE UNLOGGED TABLE IF NOT EXISTS run_batch (
    partner_id       text        NOT NULL,
    run_id           text        NOT NULL,
    identifier       text        NOT NULL,
    kind             "char"      NOT NULL,
    datestamp        timestamptz,
    observed_at      timestamptz NOT NULL,
    seq              bigint      NOT NULL,
    metadata_prefix  text,
    metadata         text,
    set_specs        text[],
    title            text,
    content_hash     text,
    channel          text        NOT NULL,
    warnings         jsonb,
    reason           text,
    regressed_clock  timestamptz,
    PRIMARY KEY (partner_id, run_id, identifier)
);
COMMENT ON TABLE run_batch IS 'Internal. A sliced run''s versions merged slice by slice while the run harvests: per identifier the newest staged version (records and tombstones). Its apply reads it instead of sorting all of staging; dropped after the apply.';
ALTER TABLE harvest_runs ADD COLUMN IF NOT EXISTS merged_attempt integer;
COMMENT ON COLUMN harvest_runs.merged_attempt IS 'The try (attempts) of this channel whose staging is merged into run_batch; another try makes the run''s batch stale (it is built again).';
ALTER TABLE harvest_runs ADD COLUMN IF NOT EXISTS merged_rows bigint;
COMMENT ON COLUMN harvest_runs.merged_rows IS 'A sliced run''s parent row: the rows run_batch holds for the run; fewer (a crash emptied it) and the apply builds it again from staging.';
