-- What is odd but usable about a record (formats/checks.py: a rebuilt leader, no 001, ...):
-- {check name: message}; NULL when nothing is. Records carry the warnings of their stored
-- version; staging carries them from the harvest to the apply.
ALTER TABLE records ADD COLUMN IF NOT EXISTS warnings jsonb;
ALTER TABLE staging ADD COLUMN IF NOT EXISTS warnings jsonb;
-- Per run and channel, how many fetched records carried each warning: {check name: count},
-- as quarantined counts rejects (the health page and the data-quality findings read it).
ALTER TABLE harvest_runs ADD COLUMN IF NOT EXISTS warnings jsonb NOT NULL DEFAULT '{}';
