-- What is broken right now: the newest reject per record, unless a valid version of that
-- record was harvested after it. `quarantine` itself stays the full per-run log.
CREATE OR REPLACE VIEW quarantine_current AS
SELECT q.*
FROM (
    SELECT DISTINCT ON (partner_id, identifier) *
    FROM quarantine
    ORDER BY partner_id, identifier, quarantined_at DESC, id DESC
) q
WHERE NOT EXISTS (
    SELECT 1 FROM records r
    WHERE r.partner_id = q.partner_id AND r.identifier = q.identifier
      AND r.harvested_at > q.quarantined_at
);
