-- Per-partner counters for the health page and `partner-harvest status`: a count(*) over
-- millions of records on every view is too slow. apply_run keeps the counters in step
-- inside its own transaction (records and quarantine are only written there); this fills
-- them once.
CREATE TABLE IF NOT EXISTS partner_stats (
    partner_id    text        PRIMARY KEY,
    records_held  bigint      NOT NULL DEFAULT 0,   -- count(*) of records
    quarantined_now bigint    NOT NULL DEFAULT 0,   -- count(*) of quarantine_current
    updated_at    timestamptz NOT NULL DEFAULT now()
);
INSERT INTO partner_stats (partner_id, records_held)
SELECT partner_id, count(*) FROM records GROUP BY partner_id
ON CONFLICT (partner_id) DO UPDATE SET records_held = EXCLUDED.records_held, updated_at = now();
INSERT INTO partner_stats AS s (partner_id, quarantined_now)
SELECT partner_id, count(*) FROM quarantine_current GROUP BY partner_id
ON CONFLICT (partner_id) DO UPDATE SET quarantined_now = EXCLUDED.quarantined_now;

-- What the partner held after each run: the health page's chart of the last runs.
ALTER TABLE harvest_runs ADD COLUMN IF NOT EXISTS records_held bigint;

-- The newest run of each partner per channel, its newest applied run, and its cursor (the
-- until of the newest applied incremental window) without reading a partner's history.
CREATE INDEX IF NOT EXISTS harvest_runs_partner_channel_newest ON harvest_runs (partner_id, channel, started_at DESC);
CREATE INDEX IF NOT EXISTS harvest_runs_partner_applied ON harvest_runs (partner_id, started_at DESC)
    WHERE status = 'applied';
CREATE INDEX IF NOT EXISTS harvest_runs_partner_cursor ON harvest_runs (partner_id, channel, window_until)
    WHERE status = 'applied' AND mode = 'incremental';
-- Today's quarantine of one partner.
CREATE INDEX IF NOT EXISTS quarantine_partner_quarantined_at ON quarantine (partner_id, quarantined_at);
