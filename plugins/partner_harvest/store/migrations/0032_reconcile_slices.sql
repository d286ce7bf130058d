-- A reconcile's sweep cut into slices: each slice, a mapped task retried on
-- its own, lists one datestamp range (OAI-PMH ListIdentifiers) or id range (Sierra) into
-- reconcile_ids under its own number, so a retry replaces only its own rows. The row says
-- what the slice swept (written in each page's transaction, as the rows it counts), so the
-- apply can tell a slice whose rows a crash lost (reconcile_ids is UNLOGGED) and sweep it again.
ALTER TABLE reconcile_ids ADD COLUMN IF NOT EXISTS slice integer NOT NULL DEFAULT 0;

CREATE TABLE IF NOT EXISTS reconcile_slices (
    partner_id   text        NOT NULL,
    run_id       text        NOT NULL,
    slice        integer     NOT NULL,
    window_from  timestamptz,
    window_until timestamptz NOT NULL,
    open_end     boolean     NOT NULL DEFAULT false,
    id_lo        bigint,
    id_hi        bigint,
    estimate     bigint,
    status       text        NOT NULL DEFAULT 'planned'
                 CHECK (status IN ('planned', 'sweeping', 'swept', 'failed')),
    attempts     integer     NOT NULL DEFAULT 0,
    pages        integer     NOT NULL DEFAULT 0,
    swept        bigint      NOT NULL DEFAULT 0,
    error        text,
    planned_at   timestamptz NOT NULL DEFAULT now(),
    progress_at  timestamptz,
    swept_at     timestamptz,
    PRIMARY KEY (partner_id, run_id, slice)
);

COMMENT ON COLUMN reconcile_ids.slice IS
    'The sweep slice that listed the identifier (reconcile_slices.slice); 0 for an unsliced sweep.';
COMMENT ON TABLE reconcile_slices IS
    'Internal. The slices of a sliced reconcile''s sweep, one row each: its range, status and progress.';
COMMENT ON COLUMN reconcile_slices.partner_id IS 'The partner reconciled.';
COMMENT ON COLUMN reconcile_slices.run_id IS 'The reconcile run: <dag_id>/<Airflow run id>.';
COMMENT ON COLUMN reconcile_slices.slice IS 'The slice number, 1 upwards (the mapped task''s order).';
COMMENT ON COLUMN reconcile_slices.window_from IS 'OAI-PMH: the range''s from (NULL: the beginning).';
COMMENT ON COLUMN reconcile_slices.window_until IS 'The range''s until (the reconcile''s clock for the last slice).';
COMMENT ON COLUMN reconcile_slices.open_end IS 'The last slice: listed without an until, so records edited during the sweep land in it.';
COMMENT ON COLUMN reconcile_slices.id_lo IS 'Sierra: the lowest bib id of the range.';
COMMENT ON COLUMN reconcile_slices.id_hi IS 'Sierra: the highest bib id of the range (NULL: open-ended).';
COMMENT ON COLUMN reconcile_slices.estimate IS 'What the plan expected the slice to list (a count or an id span), for progress only.';
COMMENT ON COLUMN reconcile_slices.status IS 'planned, sweeping, swept or failed; the apply refuses until every slice is swept.';
COMMENT ON COLUMN reconcile_slices.attempts IS 'How many times the slice started sweeping.';
COMMENT ON COLUMN reconcile_slices.pages IS 'Pages the current attempt listed.';
COMMENT ON COLUMN reconcile_slices.swept IS 'Identifiers the current attempt staged in reconcile_ids (written with each page).';
COMMENT ON COLUMN reconcile_slices.error IS 'Why the last attempt failed, one line.';
COMMENT ON COLUMN reconcile_slices.planned_at IS 'When the reconcile planned its sweep (the database''s clock).';
COMMENT ON COLUMN reconcile_slices.progress_at IS 'When the slice last staged a page.';
COMMENT ON COLUMN reconcile_slices.swept_at IS 'When the slice finished sweeping.';
