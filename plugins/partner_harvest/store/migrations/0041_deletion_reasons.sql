-- Purges that are not the partner's own deletion notice carry why (records.Tombstone.reason):
-- the change feed passes deletions.reason on to consumers.
COMMENT ON COLUMN deletions.reason IS 'tombstone (the partner announced the deletion), reconcile (the weekly reconcile found the record gone), forgotten (partner-harvest forget), suppressed (a Sierra bib became suppressed, options.sierra.suppressed: purge), no_marc (a Sierra bib listed without MARC), excluded_set (an OAI-PMH record moved into one of exclude_sets) or outside_sets (an OAI-PMH record left the partner''s sets).';
