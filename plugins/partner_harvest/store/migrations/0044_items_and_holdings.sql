-- Items and holdings: records attached to a partner's records (a library's copies and its
-- serial holdings, each belonging to one or more bibs), harvested on channels of their own
-- (store/attached.py applies them in the run's one transaction).

-- A staged item carries the table it lands in and the records it belongs to.
ALTER TABLE staging ADD COLUMN IF NOT EXISTS entity text;   -- NULL: records; else items or holdings
ALTER TABLE staging ADD COLUMN IF NOT EXISTS parents text[];

CREATE TABLE IF NOT EXISTS items (
    partner_id       text        NOT NULL,
    identifier       text        NOT NULL,
    bib_ids          text[]      NOT NULL DEFAULT '{}',
    datestamp        timestamptz NOT NULL,
    content          jsonb       NOT NULL,
    content_hash     text        NOT NULL,
    warnings         jsonb,
    run_id           text        NOT NULL,
    observed_at      timestamptz NOT NULL,
    regressed_clock  timestamptz,
    change_seq       bigint      NOT NULL DEFAULT nextval('change_seq'),
    harvested_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (partner_id, identifier)
);
CREATE TABLE IF NOT EXISTS holdings (LIKE items INCLUDING DEFAULTS INCLUDING CONSTRAINTS);
ALTER TABLE holdings ADD PRIMARY KEY (partner_id, identifier);
CREATE INDEX IF NOT EXISTS items_bib_ids ON items USING gin (bib_ids);
CREATE INDEX IF NOT EXISTS holdings_bib_ids ON holdings USING gin (bib_ids);
CREATE INDEX IF NOT EXISTS items_partner_change_seq ON items (partner_id, change_seq);
CREATE INDEX IF NOT EXISTS holdings_partner_change_seq ON holdings (partner_id, change_seq);

-- The purges remembered, so an older version applied later cannot bring an item back (I10).
CREATE TABLE IF NOT EXISTS attached_tombstones (
    partner_id       text        NOT NULL,
    entity           text        NOT NULL,
    identifier       text        NOT NULL,
    datestamp        timestamptz NOT NULL,
    observed_at      timestamptz NOT NULL,
    run_id           text        NOT NULL,
    regressed_clock  timestamptz,
    PRIMARY KEY (partner_id, entity, identifier)
);

CREATE TABLE IF NOT EXISTS attached_deletions (
    id                  bigserial   PRIMARY KEY,
    partner_id          text        NOT NULL,
    entity              text        NOT NULL,
    identifier          text        NOT NULL,
    bib_ids             text[]      NOT NULL DEFAULT '{}',
    upstream_datestamp  timestamptz,
    reason              text        NOT NULL,
    run_id              text        NOT NULL,
    change_seq          bigint      NOT NULL DEFAULT nextval('change_seq'),
    deleted_at          timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS attached_deletions_partner_change_seq ON attached_deletions (partner_id, change_seq);

-- One row per record whose items or holdings changed: its newest such change in the feed.
CREATE TABLE IF NOT EXISTS attachment_events (
    partner_id   text        NOT NULL,
    identifier   text        NOT NULL,
    change_seq   bigint      NOT NULL,
    run_id       text        NOT NULL,
    changed_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (partner_id, identifier)
);
CREATE INDEX IF NOT EXISTS attachment_events_partner_change_seq ON attachment_events (partner_id, change_seq);

COMMENT ON TABLE items IS
    'One row per live item (a copy: location, status, barcode, call number) of a partner with an items channel (Sierra options.sierra.channels), key (partner_id, identifier).';
COMMENT ON TABLE holdings IS
    'One row per live holdings record (a serial''s checkin card) of a partner with a holdings channel, key (partner_id, identifier); columns as items.';
COMMENT ON COLUMN items.partner_id IS 'The registry id of the partner.';
COMMENT ON COLUMN items.identifier IS 'The item''s id at the partner (Sierra item id without i or check digit).';
COMMENT ON COLUMN items.bib_ids IS 'The records (bibs, records.identifier) the item belongs to; may name bibs not held (suppressed, not yet harvested).';
COMMENT ON COLUMN items.datestamp IS 'The partner''s version stamp of the stored version, UTC (Sierra updatedDate).';
COMMENT ON COLUMN items.content IS 'The item as the partner''s API gave it (Sierra: the fields asked for), JSON; values keep the types the partner used.';
COMMENT ON COLUMN items.content_hash IS 'A hash of content: equal hashes at equal datestamps make a re-seen version a no-op.';
COMMENT ON COLUMN items.warnings IS 'What is odd but usable (sierra.suppressed with options.sierra.suppressed: flag): jsonb {check: message}, or NULL.';
COMMENT ON COLUMN items.run_id IS 'The run that stored this version: harvest_runs.run_id.';
COMMENT ON COLUMN items.observed_at IS 'When the stored version was staged: the tie-breaker of versions with equal datestamps.';
COMMENT ON COLUMN items.regressed_clock IS 'Set when the version came from a run whose partner clock had gone back: that clock.';
COMMENT ON COLUMN items.change_seq IS 'The change-feed number of the row''s newest change; see partner_feed.high_water.';
COMMENT ON COLUMN items.harvested_at IS 'When the stored version landed (our clock); not part of the change-feed contract.';
COMMENT ON COLUMN holdings.partner_id IS 'The registry id of the partner.';
COMMENT ON COLUMN holdings.identifier IS 'The holdings record''s id at the partner (Sierra checkin record id without c or check digit).';
COMMENT ON COLUMN holdings.bib_ids IS 'The records (bibs, records.identifier) the holdings record belongs to.';
COMMENT ON COLUMN holdings.datestamp IS 'The partner''s version stamp of the stored version, UTC (Sierra updatedDate).';
COMMENT ON COLUMN holdings.content IS 'The holdings record as the partner''s API gave it, JSON; values keep the types the partner used.';
COMMENT ON COLUMN holdings.content_hash IS 'A hash of content: equal hashes at equal datestamps make a re-seen version a no-op.';
COMMENT ON COLUMN holdings.warnings IS 'What is odd but usable: jsonb {check: message}, or NULL.';
COMMENT ON COLUMN holdings.run_id IS 'The run that stored this version: harvest_runs.run_id.';
COMMENT ON COLUMN holdings.observed_at IS 'When the stored version was staged.';
COMMENT ON COLUMN holdings.regressed_clock IS 'Set when the version came from a run whose partner clock had gone back: that clock.';
COMMENT ON COLUMN holdings.change_seq IS 'The change-feed number of the row''s newest change.';
COMMENT ON COLUMN holdings.harvested_at IS 'When the stored version landed (our clock).';

COMMENT ON TABLE attached_tombstones IS
    'Internal: the newest purge of each item or holdings record, so an older version applied later cannot bring it back.';
COMMENT ON TABLE attached_deletions IS
    'One row per purge of an item or holdings record: the change feed''s item-level deletions.';
COMMENT ON COLUMN attached_deletions.id IS 'A surrogate key; order by change_seq.';
COMMENT ON COLUMN attached_deletions.partner_id IS 'The registry id of the partner.';
COMMENT ON COLUMN attached_deletions.entity IS 'Which table the purged row was in: items or holdings.';
COMMENT ON COLUMN attached_deletions.identifier IS 'The identifier of the purged item or holdings record.';
COMMENT ON COLUMN attached_deletions.bib_ids IS 'The records it belonged to when it was purged.';
COMMENT ON COLUMN attached_deletions.upstream_datestamp IS 'The stamp of the deletion (Sierra deletedDate, at the last microsecond of its day; a suppression at its updatedDate).';
COMMENT ON COLUMN attached_deletions.reason IS 'tombstone (the partner deleted it), suppressed (it became suppressed, options.sierra.suppressed: purge), reconcile (the weekly reconcile found it gone) or forgotten.';
COMMENT ON COLUMN attached_deletions.run_id IS 'The run that purged it.';
COMMENT ON COLUMN attached_deletions.change_seq IS 'The change-feed number of the purge.';
COMMENT ON COLUMN attached_deletions.deleted_at IS 'When it was purged (our clock); not part of the change-feed contract.';
COMMENT ON TABLE attachment_events IS
    'One row per record whose items or holdings changed (an item landed, changed, moved to or from it, or was purged): the change feed''s record-level event for them, at its newest change_seq.';
COMMENT ON COLUMN attachment_events.partner_id IS 'The registry id of the partner.';
COMMENT ON COLUMN attachment_events.identifier IS 'The record (bib, records.identifier) whose items or holdings changed; it may not be held.';
COMMENT ON COLUMN attachment_events.change_seq IS 'The change-feed number of the newest such change.';
COMMENT ON COLUMN attachment_events.run_id IS 'The run that made it.';
COMMENT ON COLUMN attachment_events.changed_at IS 'When (our clock); not part of the change-feed contract.';
COMMENT ON COLUMN staging.entity IS 'Internal: where a staged item lands: NULL for records, else items or holdings.';
COMMENT ON COLUMN staging.parents IS 'Internal: the records a staged item or holdings record belongs to.';
