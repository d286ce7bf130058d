-- The change feed (docs/consumers.md).
--
-- Every row the apply writes to `records` (insert or real update) and every `deletions`
-- row carries a value of ONE sequence, taken inside the apply transaction while it holds
-- the partner's advisory lock: per partner, values commit in increasing order. A reader
-- reads "changes of partner P with change_seq > my position, up to partner_feed.high_water"
-- and never misses or repeats one. Values are not dense (gaps are normal).
CREATE SEQUENCE IF NOT EXISTS change_seq AS bigint;

ALTER TABLE records ADD COLUMN IF NOT EXISTS change_seq bigint;
ALTER TABLE deletions ADD COLUMN IF NOT EXISTS change_seq bigint;
-- Rows from before the feed: numbered once, oldest first, so a new consumer sees them all.
UPDATE records r SET change_seq = n.seq
FROM (SELECT partner_id, identifier, nextval('change_seq') AS seq
      FROM (SELECT partner_id, identifier FROM records WHERE change_seq IS NULL
            ORDER BY harvested_at, partner_id, identifier) o) n
WHERE r.partner_id = n.partner_id AND r.identifier = n.identifier;
UPDATE deletions d SET change_seq = n.seq
FROM (SELECT id, nextval('change_seq') AS seq
      FROM (SELECT id FROM deletions WHERE change_seq IS NULL ORDER BY id) o) n
WHERE d.id = n.id;
-- A writer that forgets the column still gets a value (the apply sets it explicitly).
ALTER TABLE records ALTER COLUMN change_seq SET DEFAULT nextval('change_seq');
ALTER TABLE deletions ALTER COLUMN change_seq SET DEFAULT nextval('change_seq');
ALTER TABLE records ALTER COLUMN change_seq SET NOT NULL;
ALTER TABLE deletions ALTER COLUMN change_seq SET NOT NULL;
CREATE INDEX IF NOT EXISTS records_partner_change_seq ON records (partner_id, change_seq);
CREATE INDEX IF NOT EXISTS deletions_partner_change_seq ON deletions (partner_id, change_seq);

-- Per partner: every change with change_seq <= high_water is committed and visible.
-- Written by the apply in the same transaction as the changes, so a reader that sees a
-- high_water also sees every change up to it (values of one partner commit in order).
CREATE TABLE IF NOT EXISTS partner_feed (
    partner_id   text        PRIMARY KEY,
    high_water   bigint      NOT NULL,
    run_id       text        NOT NULL,   -- the apply that wrote it
    updated_at   timestamptz NOT NULL DEFAULT now()
);
INSERT INTO partner_feed (partner_id, high_water, run_id)
SELECT partner_id, max(change_seq), 'migration 0007_change_feed'
FROM (SELECT partner_id, change_seq FROM records UNION ALL SELECT partner_id, change_seq FROM deletions) c
GROUP BY partner_id
ON CONFLICT (partner_id) DO NOTHING;

-- Which changes each applied run produced: partner P, change_seq in (after, until].
ALTER TABLE harvest_runs ADD COLUMN IF NOT EXISTS change_seq_after bigint;
ALTER TABLE harvest_runs ADD COLUMN IF NOT EXISTS change_seq_until bigint;

-- Where each downstream consumer stands, per partner: changes with change_seq <= position
-- are exported. pending_until: an export of (position, pending_until] under way; a rerun
-- after a crash exports exactly that range again (same file) before moving on.
CREATE TABLE IF NOT EXISTS feed_positions (
    consumer       text        NOT NULL,
    partner_id     text        NOT NULL,
    position       bigint      NOT NULL DEFAULT 0,
    pending_until  bigint,
    updated_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, partner_id)
);
