-- Sliced runs. A big window is harvested as slices: channels 'changes/001',
-- 'changes/002', ... of the run, each with its own row. The run's 'changes' row stays the
-- parent (the frozen window). window_from/window_until hold an OAI slice's datestamp range
-- (or a Sierra change poll's updatedDate range); slice_lo/slice_hi a Sierra export slice's
-- id range. While a channel harvests, pages/fetched are written after every staged page
-- (in the page's transaction) with progress_at; checkpoint is the keyset position a Sierra
-- slice resumes from after a failure (the staged pages before it are kept); resumed counts
-- how often it did; expected is how many items the channel should bring (the plan's
-- estimate, then the completeListSize its pages announce), for an estimate of the time left;
-- harvesting_since is when the channel's harvest (its latest try) began: a slice may wait
-- in the partner's pool long after the run started.
ALTER TABLE harvest_runs
    ADD COLUMN IF NOT EXISTS slice_lo bigint,
    ADD COLUMN IF NOT EXISTS slice_hi bigint,
    ADD COLUMN IF NOT EXISTS progress_at timestamptz,
    ADD COLUMN IF NOT EXISTS checkpoint bigint,
    ADD COLUMN IF NOT EXISTS resumed integer NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS expected bigint,
    ADD COLUMN IF NOT EXISTS harvesting_since timestamptz;
