-- The files a file-delivery partner's run read (files/): the run audit per file, and what
-- the next freeze compares the partner's listing with: a delivery is applied once, again
-- only when one of its files changed in place (another size, ETag or checksum).
CREATE TABLE IF NOT EXISTS delivery_files (
    partner_id text NOT NULL,
    run_id text NOT NULL,
    channel text NOT NULL,
    delivered timestamptz NOT NULL,
    kind text NOT NULL CHECK (kind IN ('full', 'delta')),
    path text NOT NULL,
    size bigint NOT NULL,
    etag text,
    checksum text,
    records bigint NOT NULL DEFAULT 0,
    read_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (partner_id, run_id, channel, path)
);
CREATE INDEX IF NOT EXISTS delivery_files_partner ON delivery_files (partner_id, delivered);

COMMENT ON TABLE delivery_files IS 'The files a file-delivery partner''s run read, one row per file: with harvest_runs (the same partner, run and channel, applied) the deliveries applied; the next freeze applies a delivery again only when a file of it changed in place.';
COMMENT ON COLUMN delivery_files.partner_id IS 'The partner (registry id).';
COMMENT ON COLUMN delivery_files.run_id IS 'The run that read the file (harvest_runs.run_id).';
COMMENT ON COLUMN delivery_files.channel IS 'The run channel that staged it (changes, or a slice changes/00N).';
COMMENT ON COLUMN delivery_files.delivered IS 'The delivery''s date, from the date placeholder of its pattern (UTC).';
COMMENT ON COLUMN delivery_files.kind IS 'full (a dump of everything the partner holds) or delta (changes and deletions).';
COMMENT ON COLUMN delivery_files.path IS 'The file''s path relative to the partner''s location.';
COMMENT ON COLUMN delivery_files.size IS 'Its size in bytes when the window froze (and as read).';
COMMENT ON COLUMN delivery_files.etag IS 'The store''s ETag, or its modification time where it has none, when the window froze.';
COMMENT ON COLUMN delivery_files.checksum IS 'algorithm:hex as verified while reading (from the delivery''s checksum file or manifest), or as computed when none was published.';
COMMENT ON COLUMN delivery_files.records IS 'Items the file yielded (records, deletions and quarantined rows).';
COMMENT ON COLUMN delivery_files.read_at IS 'When the file was read to its end.';

COMMENT ON COLUMN deletions.reason IS 'tombstone (the partner announced the deletion), reconcile (the weekly reconcile found the record gone), forgotten (partner-harvest forget), rollback (a rollback removed a record that did not exist before the run it undid), suppressed (a Sierra bib became suppressed, options.sierra.suppressed: purge), no_marc (a Sierra bib listed without MARC), excluded_set (an OAI-PMH record moved into one of exclude_sets), outside_sets (an OAI-PMH record left the partner''s sets) or not_listed (absent from a run that lists the partner''s whole collection: a file partner''s full dump).';
