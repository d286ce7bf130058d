-- An IIIF Change Discovery slice is a range of stream pages. Page URLs need not be
-- predictable, so the plan walks the chain once and writes each slice's page URLs (newest
-- first) with the activities it counted on each: a retried slice resumes at the page after
-- its checkpoint (the position of its next page) without walking the chain again, and proves
-- that the pages it read still hold what the plan counted.
ALTER TABLE harvest_runs ADD COLUMN IF NOT EXISTS slice_pages text[];
ALTER TABLE harvest_runs ADD COLUMN IF NOT EXISTS slice_page_items integer[];

COMMENT ON COLUMN harvest_runs.slice_pages IS
    'IIIF: the stream page URLs an IIIF slice harvests, newest first (slice_lo..slice_hi are their positions counted back from the frozen last page, 0); NULL otherwise.';
COMMENT ON COLUMN harvest_runs.slice_page_items IS
    'IIIF: the activities the slice plan counted on each of slice_pages (the slice''s second witness); NULL otherwise.';
COMMENT ON COLUMN harvest_runs.checkpoint IS
    'Where a slice resumes after a failed try: the keyset position of a Sierra slice, the position of the next stream page of an IIIF one.';
COMMENT ON COLUMN harvest_runs.resumed IS 'How often a Sierra or IIIF slice resumed from its checkpoint.';
COMMENT ON COLUMN harvest_runs.slice_lo IS
    'A Sierra id-range slice''s lowest bib id; an IIIF slice''s newest page position (0: the frozen last page); NULL for other channels.';
COMMENT ON COLUMN harvest_runs.slice_hi IS
    'A Sierra id-range slice''s highest bib id (NULL for the open-ended last slice); an IIIF slice''s oldest page position; NULL for other channels.';
