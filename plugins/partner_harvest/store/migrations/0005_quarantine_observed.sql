-- When a reject was observed, so that "broken now" compares observations, not commit times:
-- a reject and a newer valid version landing in one run have the same commit time.
ALTER TABLE quarantine ADD COLUMN IF NOT EXISTS observed_at timestamptz;
UPDATE quarantine SET observed_at = quarantined_at WHERE observed_at IS NULL;
ALTER TABLE quarantine ALTER COLUMN observed_at SET DEFAULT clock_timestamp();
ALTER TABLE quarantine ALTER COLUMN observed_at SET NOT NULL;

-- What is broken right now: the newest reject per record, unless a version of that record
-- observed after it is held (or, for rows from before observation times, harvested after it).
CREATE OR REPLACE VIEW quarantine_current AS
SELECT q.*
FROM (
    SELECT DISTINCT ON (partner_id, identifier) *
    FROM quarantine
    ORDER BY partner_id, identifier, observed_at DESC, id DESC
) q
WHERE NOT EXISTS (
    SELECT 1 FROM records r
    WHERE r.partner_id = q.partner_id AND r.identifier = q.identifier
      AND (r.observed_at > q.observed_at OR r.harvested_at > q.quarantined_at)
);
