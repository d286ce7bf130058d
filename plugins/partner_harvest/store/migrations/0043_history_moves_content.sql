-- Trust, verify, undo: the versions a change replaced (record_history, kept for the partner's
-- history_retention), the state after each apply (feed_marks, for "as of" reads and
-- rollbacks), rollbacks, identifiers that moved, and the weekly content check.

CREATE TABLE IF NOT EXISTS record_history (
    partner_id          text        NOT NULL,
    identifier          text        NOT NULL,
    datestamp           timestamptz NOT NULL,
    metadata_prefix     text        NOT NULL,
    metadata            text        NOT NULL,
    set_specs           text[]      NOT NULL DEFAULT '{}',
    title               text,
    content_hash        text        NOT NULL,
    warnings            jsonb,
    first_harvested_at  timestamptz NOT NULL,
    harvested_at        timestamptz NOT NULL,
    run_id              text        NOT NULL,
    observed_at         timestamptz NOT NULL,
    regressed_clock     timestamptz,
    change_seq          bigint      NOT NULL,
    superseded_seq      bigint      NOT NULL,
    superseded_at       timestamptz NOT NULL DEFAULT now(),
    superseded_by       text        NOT NULL,
    ended_by            text        NOT NULL CHECK (ended_by IN ('updated', 'purged', 'moved', 'rollback'))
);
CREATE INDEX IF NOT EXISTS record_history_superseded ON record_history (partner_id, superseded_seq);

CREATE TABLE IF NOT EXISTS feed_marks (
    mark        bigserial   PRIMARY KEY,
    partner_id  text        NOT NULL,
    run_id      text        NOT NULL,
    change_seq_after bigint NOT NULL,
    high_water  bigint      NOT NULL,
    marked_at   timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX IF NOT EXISTS feed_marks_partner ON feed_marks (partner_id, mark);
CREATE INDEX IF NOT EXISTS feed_marks_run ON feed_marks (partner_id, run_id);

CREATE TABLE IF NOT EXISTS partner_history (
    partner_id      text        PRIMARY KEY,
    pruned_through  bigint      NOT NULL,
    pruned_at       timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE IF NOT EXISTS moves (
    partner_id      text        NOT NULL,
    old_identifier  text        NOT NULL,
    new_identifier  text        NOT NULL,
    content_hash    text        NOT NULL,
    run_id          text        NOT NULL,
    moved_at        timestamptz NOT NULL DEFAULT now(),
    change_seq      bigint      NOT NULL
);
CREATE INDEX IF NOT EXISTS moves_partner_change_seq ON moves (partner_id, change_seq);

CREATE TABLE IF NOT EXISTS rollbacks (
    id                bigserial   PRIMARY KEY,
    partner_id        text        NOT NULL,
    to_before_run     text        NOT NULL,
    undone_runs       text[]      NOT NULL,
    requested_by      text        NOT NULL,
    via               text        NOT NULL,
    done_at           timestamptz NOT NULL DEFAULT now(),
    restored          integer     NOT NULL,
    removed           integer     NOT NULL,
    cursors           jsonb       NOT NULL DEFAULT '{}'::jsonb,
    change_seq_after  bigint,
    change_seq_until  bigint
);
CREATE INDEX IF NOT EXISTS rollbacks_partner ON rollbacks (partner_id, done_at DESC);

CREATE TABLE IF NOT EXISTS partner_content (
    partner_id        text        PRIMARY KEY,
    checks            integer     NOT NULL DEFAULT 0,
    last_check_run    text,
    last_checked_at   timestamptz,
    last_sampled      integer     NOT NULL DEFAULT 0,
    last_silent       integer     NOT NULL DEFAULT 0,
    unreliable_since  timestamptz,
    examples          jsonb       NOT NULL DEFAULT '[]'::jsonb,
    refresh_due       text,
    refresh_due_since timestamptz,
    last_refresh_run  text,
    last_refresh_at   timestamptz
);

ALTER TABLE harvest_runs ADD COLUMN IF NOT EXISTS content_sampled integer;
ALTER TABLE harvest_runs ADD COLUMN IF NOT EXISTS content_silent integer;
ALTER TABLE harvest_runs ADD COLUMN IF NOT EXISTS content_requests integer;
ALTER TABLE harvest_runs ADD COLUMN IF NOT EXISTS refresh text;
ALTER TABLE harvest_runs ADD COLUMN IF NOT EXISTS moved integer NOT NULL DEFAULT 0;

ALTER TABLE approval_requests ADD COLUMN IF NOT EXISTS movable bigint NOT NULL DEFAULT 0;
ALTER TABLE approval_requests ADD COLUMN IF NOT EXISTS move boolean NOT NULL DEFAULT false;

-- The partner's records as they were when its change feed stood at p_seq: the current rows
-- written by then, and the superseded versions that were current then.
CREATE OR REPLACE FUNCTION records_at_change(p_partner text, p_seq bigint)
RETURNS TABLE (identifier text, datestamp timestamptz, metadata_prefix text, metadata text, set_specs text[],
               title text, content_hash text, first_harvested_at timestamptz, run_id text, change_seq bigint)
LANGUAGE sql STABLE AS $$
    SELECT r.identifier, r.datestamp, r.metadata_prefix, r.metadata, r.set_specs, r.title, r.content_hash,
           r.first_harvested_at, r.run_id, r.change_seq
    FROM records r WHERE r.partner_id = p_partner AND r.change_seq <= p_seq
    UNION ALL
    SELECT h.identifier, h.datestamp, h.metadata_prefix, h.metadata, h.set_specs, h.title, h.content_hash,
           h.first_harvested_at, h.run_id, h.change_seq
    FROM record_history h
    WHERE h.partner_id = p_partner AND h.superseded_seq > p_seq AND h.change_seq <= p_seq
$$;

-- The partner's records as of an instant: as they were after the last apply (or rollback)
-- that had committed by then. Refuses an instant before the partner's retained history.
CREATE OR REPLACE FUNCTION records_as_of(p_partner text, p_at timestamptz)
RETURNS TABLE (identifier text, datestamp timestamptz, metadata_prefix text, metadata text, set_specs text[],
               title text, content_hash text, first_harvested_at timestamptz, run_id text, change_seq bigint)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_seq bigint;
BEGIN
    SELECT m.high_water INTO v_seq FROM feed_marks m
    WHERE m.partner_id = p_partner AND m.marked_at <= p_at ORDER BY m.mark DESC LIMIT 1;
    IF v_seq IS NULL OR v_seq < COALESCE((SELECT p.pruned_through FROM partner_history p
                                          WHERE p.partner_id = p_partner), 0) THEN
        RAISE EXCEPTION 'records_as_of: no state of partner % is kept for %: its retained history starts at %',
            p_partner, p_at,
            COALESCE((SELECT min(m.marked_at)::text FROM feed_marks m WHERE m.partner_id = p_partner), 'no apply yet');
    END IF;
    RETURN QUERY SELECT * FROM records_at_change(p_partner, v_seq);
END
$$;

COMMENT ON TABLE record_history IS
    'Versions of records that a change replaced or removed (an update, a purge, a move, a rollback), kept for the partner''s history_retention: what rollback restores and records_as_of reads.';
COMMENT ON COLUMN record_history.partner_id IS 'The registry id of the partner.';
COMMENT ON COLUMN record_history.identifier IS 'The identifier the version was held under.';
COMMENT ON COLUMN record_history.datestamp IS 'As records.datestamp, for this version.';
COMMENT ON COLUMN record_history.metadata_prefix IS 'As records.metadata_prefix, for this version.';
COMMENT ON COLUMN record_history.metadata IS 'As records.metadata, for this version.';
COMMENT ON COLUMN record_history.set_specs IS 'As records.set_specs, for this version.';
COMMENT ON COLUMN record_history.title IS 'As records.title, for this version.';
COMMENT ON COLUMN record_history.content_hash IS 'As records.content_hash, for this version.';
COMMENT ON COLUMN record_history.warnings IS 'As records.warnings, for this version.';
COMMENT ON COLUMN record_history.first_harvested_at IS 'As records.first_harvested_at, when this version was held.';
COMMENT ON COLUMN record_history.harvested_at IS 'When this version landed (our clock).';
COMMENT ON COLUMN record_history.run_id IS 'The run that stored this version.';
COMMENT ON COLUMN record_history.observed_at IS 'As records.observed_at, for this version.';
COMMENT ON COLUMN record_history.regressed_clock IS 'As records.regressed_clock, for this version.';
COMMENT ON COLUMN record_history.change_seq IS 'The change-feed number this version was written at: it was current from there.';
COMMENT ON COLUMN record_history.superseded_seq IS 'The change-feed number of the change that ended it: it was current up to just before there.';
COMMENT ON COLUMN record_history.superseded_at IS 'When it was replaced or removed (our clock); history_retention counts from here.';
COMMENT ON COLUMN record_history.superseded_by IS 'The run (or rollback/<id>) whose change ended it.';
COMMENT ON COLUMN record_history.ended_by IS 'updated (a newer version landed), purged, moved (its record moved to another identifier: moves) or rollback (a rollback replaced or removed it).';

COMMENT ON TABLE feed_marks IS
    'One row per apply, forget or rollback of a partner, in commit order: where its change feed stood after it. records_as_of and rollback read the state at a mark; kept for the partner''s history_retention.';
COMMENT ON SEQUENCE feed_marks_mark_seq IS 'Numbers feed_marks.mark.';
COMMENT ON COLUMN feed_marks.mark IS 'The order of the writes of one partner (they hold the partner''s apply lock one at a time).';
COMMENT ON COLUMN feed_marks.partner_id IS 'The registry id of the partner.';
COMMENT ON COLUMN feed_marks.run_id IS 'The run applied (harvest_runs.run_id), forget, or rollback/<id>.';
COMMENT ON COLUMN feed_marks.change_seq_after IS 'The partner''s high water before this write: the state "before the run".';
COMMENT ON COLUMN feed_marks.high_water IS 'The partner''s high water after this write: the state "after the run".';
COMMENT ON COLUMN feed_marks.marked_at IS 'When the write reached its end, under the partner''s lock (our clock): records_as_of picks the last mark at or before its instant.';

COMMENT ON TABLE partner_history IS
    'Per partner, how far back record_history reaches: rollbacks and records_as_of refuse a state before pruned_through.';
COMMENT ON COLUMN partner_history.partner_id IS 'The registry id of the partner.';
COMMENT ON COLUMN partner_history.pruned_through IS 'The change-feed number up to which superseded versions were dropped (history_retention): the earliest state that can be read or restored.';
COMMENT ON COLUMN partner_history.pruned_at IS 'When the newest prune ran (our clock).';

COMMENT ON TABLE moves IS
    'Records that moved to another identifier at a person''s Move (approval gate): one row per move, a change-feed event (op moved) of its own.';
COMMENT ON COLUMN moves.partner_id IS 'The registry id of the partner.';
COMMENT ON COLUMN moves.old_identifier IS 'The identifier the record was held under.';
COMMENT ON COLUMN moves.new_identifier IS 'The identifier it is held under from this move on.';
COMMENT ON COLUMN moves.content_hash IS 'The content hash both identifiers carried (what matched them).';
COMMENT ON COLUMN moves.run_id IS 'The run whose apply moved it.';
COMMENT ON COLUMN moves.moved_at IS 'When the move was applied (our clock).';
COMMENT ON COLUMN moves.change_seq IS 'The change-feed number of the move; the moved record''s row carries it too until its next change.';

COMMENT ON TABLE rollbacks IS
    'Every rollback of a partner (partner-harvest rollback, or the rollback DAG after a person''s confirmation): who, when, what.';
COMMENT ON COLUMN rollbacks.id IS 'The rollback''s number; its writes carry the run id rollback/<id>.';
COMMENT ON COLUMN rollbacks.partner_id IS 'The registry id of the partner.';
COMMENT ON COLUMN rollbacks.to_before_run IS 'The run it undid, with every later one: the records are as they were before this run applied.';
COMMENT ON COLUMN rollbacks.undone_runs IS 'Every run (and earlier rollback) it undid, in apply order.';
COMMENT ON COLUMN rollbacks.requested_by IS 'Who asked: the operating-system user of the command line, or the Airflow user who confirmed it.';
COMMENT ON COLUMN rollbacks.via IS 'cli (partner-harvest rollback) or the DAG run that did it.';
COMMENT ON COLUMN rollbacks.done_at IS 'When it was applied (our clock).';
COMMENT ON COLUMN rollbacks.restored IS 'Records written back (an older version, or a purged record again).';
COMMENT ON COLUMN rollbacks.removed IS 'Records removed because they did not exist before the run (change feed: deletions with reason rollback).';
COMMENT ON COLUMN rollbacks.cursors IS 'Each cursor Variable set back: {key: {"from": ..., "to": ... or null (deleted)}}.';
COMMENT ON COLUMN rollbacks.change_seq_after IS 'The change-feed range of its writes: after < change_seq <= until.';
COMMENT ON COLUMN rollbacks.change_seq_until IS 'See change_seq_after.';

COMMENT ON TABLE partner_content IS
    'Per partner, what the weekly content check found (a sample of held records fetched by identifier and compared by content) and the content refreshes it brought.';
COMMENT ON COLUMN partner_content.partner_id IS 'The registry id of the partner.';
COMMENT ON COLUMN partner_content.checks IS 'Reconciles that checked content (options.content_check.refresh_every counts them).';
COMMENT ON COLUMN partner_content.last_check_run IS 'The reconcile run of the newest check.';
COMMENT ON COLUMN partner_content.last_checked_at IS 'When the newest check ran (our clock).';
COMMENT ON COLUMN partner_content.last_sampled IS 'Records the newest check compared.';
COMMENT ON COLUMN partner_content.last_silent IS 'Of those, records whose content differed while their datestamp had not moved.';
COMMENT ON COLUMN partner_content.unreliable_since IS 'Set while the partner''s datestamps are unreliable: the newest check found silent changes (since this check); NULL once a check finds none.';
COMMENT ON COLUMN partner_content.examples IS 'A few records the newest finding named: [{identifier, held_datestamp, held_hash, partner_hash}].';
COMMENT ON COLUMN partner_content.refresh_due IS 'Why a content refresh (a full harvest of the next night) is due; NULL: none due.';
COMMENT ON COLUMN partner_content.refresh_due_since IS 'When the refresh became due.';
COMMENT ON COLUMN partner_content.last_refresh_run IS 'The newest applied content refresh.';
COMMENT ON COLUMN partner_content.last_refresh_at IS 'When it applied (our clock).';

COMMENT ON COLUMN harvest_runs.content_sampled IS 'A reconcile: held records its content check fetched by identifier and compared (NULL: no check).';
COMMENT ON COLUMN harvest_runs.content_silent IS 'A reconcile: of those, records whose content had changed while their datestamp had not.';
COMMENT ON COLUMN harvest_runs.content_requests IS 'A reconcile: requests its content check sent.';
COMMENT ON COLUMN harvest_runs.refresh IS 'Why this run is a content refresh (a full harvest the content check asked for); NULL for an ordinary run.';
COMMENT ON COLUMN harvest_runs.moved IS 'Records this channel''s apply moved to a new identifier (a person chose Move); counted among upserted.';
COMMENT ON COLUMN approval_requests.movable IS 'Records the run would purge whose content hash a record it adds carries: what Move would move.';
COMMENT ON COLUMN approval_requests.move IS 'The person chose Move: the approved apply moves the matched records to their new identifiers.';
COMMENT ON COLUMN deletions.reason IS 'tombstone (the partner announced the deletion), reconcile (the weekly reconcile found the record gone), forgotten (partner-harvest forget), rollback (a rollback removed a record that did not exist before the run it undid), suppressed (a Sierra bib became suppressed, options.sierra.suppressed: purge), no_marc (a Sierra bib listed without MARC), excluded_set (an OAI-PMH record moved into one of exclude_sets) or outside_sets (an OAI-PMH record left the partner''s sets).';
