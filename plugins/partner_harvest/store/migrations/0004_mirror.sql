-- A mirror that cannot silently diverge (order-independent apply, completeness checks).

-- When each version was observed (staged). Versions are ordered by (datestamp, observed_at):
-- at equal upstream datestamps (a day-granular partner edited twice in a day) the later
-- observation wins, whatever order the runs are applied in (I10).
ALTER TABLE staging ADD COLUMN IF NOT EXISTS observed_at timestamptz NOT NULL DEFAULT clock_timestamp();
ALTER TABLE records ADD COLUMN IF NOT EXISTS observed_at timestamptz NOT NULL DEFAULT '-infinity';

-- The newest known deletion of every identifier: a late apply of an older run can never
-- bring a purged record back (I10). One row per identifier; replaced only by a newer one.
CREATE TABLE IF NOT EXISTS tombstones (
    partner_id   text        NOT NULL,
    identifier   text        NOT NULL,
    datestamp    timestamptz NOT NULL,
    observed_at  timestamptz NOT NULL,
    run_id       text        NOT NULL,
    PRIMARY KEY (partner_id, identifier)
);

-- Completeness proven by a second witness (I12): what the check compared, and its result.
ALTER TABLE harvest_runs ADD COLUMN IF NOT EXISTS check_kind text;          -- e.g. 'sierra-id-enumeration'
ALTER TABLE harvest_runs ADD COLUMN IF NOT EXISTS check_expected bigint;    -- what the witness says
ALTER TABLE harvest_runs ADD COLUMN IF NOT EXISTS check_found bigint;       -- what this run holds
ALTER TABLE harvest_runs ADD COLUMN IF NOT EXISTS check_ok boolean;         -- NULL: no check ran
ALTER TABLE harvest_runs ADD COLUMN IF NOT EXISTS check_detail text;
