-- An OAI-PMH slice may be a set instead of a datestamp range (registry slicing.sets): the
-- slice harvests its set over the run's whole window. NULL for every other slice.
ALTER TABLE harvest_runs ADD COLUMN IF NOT EXISTS slice_set text;
