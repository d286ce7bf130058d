-- Who is working on a partner right now: harvest runs share, a reconcile runs alone.
CREATE TABLE IF NOT EXISTS partner_leases (
    partner_id   text        NOT NULL,
    holder       text        NOT NULL,   -- the Airflow run holding it
    kind         text        NOT NULL,   -- 'harvest' or 'reconcile'
    acquired_at  timestamptz NOT NULL DEFAULT now(),
    expires_at   timestamptz NOT NULL,
    PRIMARY KEY (partner_id, holder)
);

-- The upstream identifier set of a reconcile sweep, staged instead of held in memory.
CREATE UNLOGGED TABLE IF NOT EXISTS reconcile_ids (
    partner_id   text        NOT NULL,
    run_id       text        NOT NULL,
    identifier   text        NOT NULL,
    datestamp    timestamptz,
    deleted      boolean     NOT NULL DEFAULT false
);
CREATE INDEX IF NOT EXISTS reconcile_ids_run ON reconcile_ids (partner_id, run_id, identifier);
