-- records (partner_id, harvested_at) was indexed for "what changed since" reads, which the
-- change feed (0007: partner_id, change_seq) now serves; no query of ours filters on it.
-- Every landed record paid for it: a 190,000-record first load spent 15% of its insert's
-- CPU maintaining it (benchmarks/oai_chain.py). harvested_at itself stays.
DROP INDEX IF EXISTS records_partner_harvested_at;
