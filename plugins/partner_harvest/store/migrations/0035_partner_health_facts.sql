-- The facts a partner's state is decided from, one row per partner, kept by a trigger on
-- harvest_runs: the health index decides the state of every partner on
-- every request (its counts, the state filter, the sort), and reading those facts from
-- harvest_runs for 10,000 partners (1.4 million rows) took seconds. The row is computed
-- from harvest_runs with the same picks store/health.py makes for one partner, so the
-- index and the partner's page decide from the same facts
-- (tests/integration/test_partner_states.py compares them, state by state).
--
-- Who writes it: only the trigger, a deferred constraint trigger on every INSERT, UPDATE and
-- DELETE of harvest_runs. It fires at the writer's COMMIT, inside the writer's transaction,
-- after all of its harvest_runs writes: a fenced write that fails rolls it back with the
-- rest, and no writer can forget it. It locks the partner's row first and then reads
-- harvest_runs afresh (READ COMMITTED: a new snapshot per statement), so of two writers of
-- one partner the later committer recomputes with the earlier one's rows. That lock is the
-- last a writer takes before its commit, so it cannot close a cycle of waits.
CREATE TABLE IF NOT EXISTS partner_health_facts (
    partner_id            text        PRIMARY KEY,
    last_run_id           text,
    last_status           text,
    last_started_at       timestamptz,
    last_error            text,
    success_run_id        text,
    success_started_at    timestamptz,
    success_fetched       bigint,
    success_purged        bigint,
    success_quarantined   bigint,
    success_announced     bigint,
    success_failed_checks text[],
    cursor_until          timestamptz,
    cursor_started_at     timestamptz,
    cursor_clock          timestamptz,
    last_fetch_at         timestamptz,
    first_run_at          timestamptz,
    refreshed_xact        xid8        NOT NULL
);

-- Writers wait for the backfill below (in-flight ones finish first), so none is missed.
LOCK TABLE harvest_runs IN SHARE MODE;

-- One partner's facts from harvest_runs; the row goes when the partner has no run left.
-- Each pick mirrors store/health.py (_PICKS, _RUN_COLUMNS, _PER_PARTNER): change both.
CREATE OR REPLACE FUNCTION partner_health_facts_refresh(pid text) RETURNS void
LANGUAGE plpgsql AS $fn$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM harvest_runs WHERE partner_id = pid) THEN
        DELETE FROM partner_health_facts WHERE partner_id = pid;
        RETURN;
    END IF;
    INSERT INTO partner_health_facts AS f (
        partner_id, last_run_id, last_status, last_started_at, last_error,
        success_run_id, success_started_at, success_fetched, success_purged, success_quarantined,
        success_announced, success_failed_checks, cursor_until, cursor_started_at, cursor_clock,
        last_fetch_at, first_run_at, refreshed_xact)
    SELECT pid, l.run_id, l.status, l.started_at, l.error,
           s.run_id, s.started_at, s.fetched, s.purged, s.quarantined, s.announced, s.failed_checks,
           c.window_until, c.started_at, c.partner_clock,
           (SELECT h.applied_at FROM harvest_runs h
             WHERE h.partner_id = pid AND h.status = 'applied' AND h.fetched > 0
             ORDER BY h.started_at DESC, h.run_id DESC, h.channel DESC LIMIT 1),
           (SELECT min(h.started_at) FROM harvest_runs h WHERE h.partner_id = pid),
           pg_current_xact_id()
    FROM (SELECT 1) one
    LEFT JOIN LATERAL (  -- the newest harvest run, its channels folded (the worst status wins)
        SELECT h.run_id,
               CASE WHEN bool_or(h.status = 'failed') THEN 'failed'
                    WHEN bool_or(h.status = 'abandoned') THEN 'abandoned'
                    WHEN bool_and(h.status = 'applied') THEN 'applied'
                    WHEN bool_or(h.status = 'waiting') THEN 'waiting'
                    ELSE 'running' END AS status,
               min(h.started_at) AS started_at,
               string_agg(h.channel || ': ' || h.error, '; ' ORDER BY h.channel)
                   FILTER (WHERE h.error IS NOT NULL) AS error
        FROM harvest_runs h
        WHERE h.partner_id = pid AND h.run_id = (
            SELECT n.run_id FROM harvest_runs n WHERE n.partner_id = pid AND n.channel = 'changes'
            ORDER BY n.started_at DESC, n.run_id DESC LIMIT 1)
        GROUP BY h.run_id
    ) l ON true
    LEFT JOIN LATERAL (  -- the newest applied harvest run: its figures feed the quality alerts
        SELECT h.run_id, min(h.started_at) AS started_at, sum(h.fetched)::bigint AS fetched,
               sum(h.purged)::bigint AS purged, sum(h.quarantined)::bigint AS quarantined,
               max(h.complete_list_size) FILTER (WHERE h.list_size_mismatch) AS announced,
               array_remove(array_agg(CASE WHEN h.check_ok = false THEN
                   h.check_kind || ' on the ' || h.channel || ' channel: the witness says '
                   || COALESCE(h.check_expected::text, 'nothing') || ', the run holds '
                   || COALESCE(h.check_found::text, 'unknown')
                   || COALESCE(' (' || NULLIF(h.check_detail, '') || ')', '') END ORDER BY h.channel),
                   NULL) AS failed_checks
        FROM harvest_runs h
        WHERE h.partner_id = pid AND h.run_id = (
            SELECT n.run_id FROM harvest_runs n
            WHERE n.partner_id = pid AND n.status = 'applied' AND n.channel = 'changes'
            ORDER BY n.started_at DESC, n.run_id DESC LIMIT 1)
        GROUP BY h.run_id
    ) s ON true
    LEFT JOIN LATERAL (  -- the cursor: the newest applied incremental window, and the clock it was frozen at
        SELECT h.window_until, h.started_at, h.partner_clock FROM harvest_runs h
        WHERE h.partner_id = pid AND h.channel = 'changes' AND h.status = 'applied' AND h.mode = 'incremental'
        ORDER BY h.window_until DESC, h.started_at DESC, h.run_id DESC LIMIT 1
    ) c ON true
    ON CONFLICT (partner_id) DO UPDATE SET
        last_run_id = EXCLUDED.last_run_id, last_status = EXCLUDED.last_status,
        last_started_at = EXCLUDED.last_started_at, last_error = EXCLUDED.last_error,
        success_run_id = EXCLUDED.success_run_id, success_started_at = EXCLUDED.success_started_at,
        success_fetched = EXCLUDED.success_fetched, success_purged = EXCLUDED.success_purged,
        success_quarantined = EXCLUDED.success_quarantined, success_announced = EXCLUDED.success_announced,
        success_failed_checks = EXCLUDED.success_failed_checks, cursor_until = EXCLUDED.cursor_until,
        cursor_started_at = EXCLUDED.cursor_started_at, cursor_clock = EXCLUDED.cursor_clock,
        last_fetch_at = EXCLUDED.last_fetch_at, first_run_at = EXCLUDED.first_run_at,
        refreshed_xact = EXCLUDED.refreshed_xact;
END
$fn$;

-- At the writer's commit, once per partner and transaction: lock the partner's row (waiting
-- for another writer's commit), then recompute it unless this transaction already did.
CREATE OR REPLACE FUNCTION partner_health_facts_touch() RETURNS trigger
LANGUAGE plpgsql AS $fn$
DECLARE
    pid text;
    done xid8;
BEGIN
    FOREACH pid IN ARRAY CASE TG_OP WHEN 'INSERT' THEN ARRAY[NEW.partner_id]
                                    WHEN 'DELETE' THEN ARRAY[OLD.partner_id]
                                    ELSE ARRAY[OLD.partner_id, NEW.partner_id] END LOOP
        -- The partner this transaction recomputed last (a setting that ends with the
        -- transaction): a statement that wrote many rows of one partner costs one recompute.
        CONTINUE WHEN current_setting('partner_harvest.health_facts_of', true) = pid;
        INSERT INTO partner_health_facts (partner_id, refreshed_xact) VALUES (pid, '0')
            ON CONFLICT (partner_id) DO NOTHING;
        SELECT f.refreshed_xact INTO done FROM partner_health_facts f WHERE f.partner_id = pid FOR UPDATE;
        IF done IS DISTINCT FROM pg_current_xact_id() THEN
            PERFORM partner_health_facts_refresh(pid);
        END IF;
        PERFORM set_config('partner_harvest.health_facts_of', pid, true);
    END LOOP;
    RETURN NULL;
END
$fn$;

DROP TRIGGER IF EXISTS partner_health_facts_touch ON harvest_runs;
CREATE CONSTRAINT TRIGGER partner_health_facts_touch
    AFTER INSERT OR UPDATE OR DELETE ON harvest_runs
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW EXECUTE FUNCTION partner_health_facts_touch();

CREATE OR REPLACE FUNCTION partner_health_facts_truncate() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    TRUNCATE partner_health_facts;
    RETURN NULL;
END
$fn$;

DROP TRIGGER IF EXISTS partner_health_facts_truncate ON harvest_runs;
CREATE TRIGGER partner_health_facts_truncate AFTER TRUNCATE ON harvest_runs
    FOR EACH STATEMENT EXECUTE FUNCTION partner_health_facts_truncate();

SELECT partner_health_facts_refresh(p.partner_id) FROM (SELECT DISTINCT partner_id FROM harvest_runs) p;

COMMENT ON TABLE partner_health_facts IS
    'Internal. Per partner, the facts of harvest_runs its state is decided from (the health index''s filter and sort), kept by a trigger at each writer''s commit.';
COMMENT ON COLUMN partner_health_facts.partner_id IS 'The partner (one row per partner with any harvest_runs row).';
COMMENT ON COLUMN partner_health_facts.last_run_id IS 'Its newest harvest run (the newest changes channel row by started_at).';
COMMENT ON COLUMN partner_health_facts.last_status IS 'That run''s channels folded: failed, abandoned, applied, waiting or running (the worst wins).';
COMMENT ON COLUMN partner_health_facts.last_started_at IS 'When that run started (its earliest channel).';
COMMENT ON COLUMN partner_health_facts.last_error IS 'That run''s errors, channel: error; ...';
COMMENT ON COLUMN partner_health_facts.success_run_id IS 'Its newest applied harvest run (NULL: none ever applied).';
COMMENT ON COLUMN partner_health_facts.success_started_at IS 'When that run started.';
COMMENT ON COLUMN partner_health_facts.success_fetched IS 'That run''s fetched, all channels.';
COMMENT ON COLUMN partner_health_facts.success_purged IS 'That run''s purged, all channels.';
COMMENT ON COLUMN partner_health_facts.success_quarantined IS 'That run''s quarantined, all channels.';
COMMENT ON COLUMN partner_health_facts.success_announced IS 'That run''s completeListSize where it disagreed with what came.';
COMMENT ON COLUMN partner_health_facts.success_failed_checks IS 'That run''s completeness checks that failed, as the alerts word them.';
COMMENT ON COLUMN partner_health_facts.cursor_until IS 'The until of its newest applied incremental window (the cursor).';
COMMENT ON COLUMN partner_health_facts.cursor_started_at IS 'When that run started (ours minus the partner''s clock: the offset).';
COMMENT ON COLUMN partner_health_facts.cursor_clock IS 'The partner''s clock that run froze its window at.';
COMMENT ON COLUMN partner_health_facts.last_fetch_at IS 'When its newest applied run that fetched anything applied (the quiet check).';
COMMENT ON COLUMN partner_health_facts.first_run_at IS 'When its oldest run on record started.';
COMMENT ON COLUMN partner_health_facts.refreshed_xact IS 'The transaction that last recomputed the row (the trigger recomputes once per transaction).';
