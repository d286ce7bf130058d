-- The aggregation: one row per live record of every partner. Downstream readers rely on
-- these tables and columns (docs/consumers.md; every column: docs/tables.md).
CREATE TABLE IF NOT EXISTS records (
    partner_id          text        NOT NULL,
    identifier          text        NOT NULL,
    datestamp           timestamptz NOT NULL,
    metadata_prefix     text        NOT NULL,
    metadata            text        NOT NULL,
    set_specs           text[]      NOT NULL DEFAULT '{}',
    title               text,
    content_hash        text        NOT NULL,
    first_harvested_at  timestamptz NOT NULL DEFAULT now(),
    harvested_at        timestamptz NOT NULL DEFAULT now(),
    run_id              text        NOT NULL,
    PRIMARY KEY (partner_id, identifier)
);
CREATE INDEX IF NOT EXISTS records_partner_harvested_at ON records (partner_id, harvested_at);

-- Every purge, so downstream can propagate deletions.
CREATE TABLE IF NOT EXISTS deletions (
    id                  bigserial   PRIMARY KEY,
    partner_id          text        NOT NULL,
    identifier          text        NOT NULL,
    upstream_datestamp  timestamptz,
    deleted_at          timestamptz NOT NULL DEFAULT now(),
    run_id              text        NOT NULL,
    reason              text        NOT NULL DEFAULT 'tombstone'
);
CREATE INDEX IF NOT EXISTS deletions_partner_deleted_at ON deletions (partner_id, deleted_at);

-- Records that failed validation: never silently dropped.
CREATE TABLE IF NOT EXISTS quarantine (
    id                  bigserial   PRIMARY KEY,
    partner_id          text        NOT NULL,
    identifier          text        NOT NULL,
    datestamp           timestamptz,
    metadata_prefix     text,
    reason              text        NOT NULL,
    raw_payload         text        NOT NULL,
    run_id              text        NOT NULL,
    quarantined_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS quarantine_partner_identifier ON quarantine (partner_id, identifier);

-- One row per run and channel: what was asked, what came back, what was applied.
CREATE TABLE IF NOT EXISTS harvest_runs (
    partner_id          text        NOT NULL,
    run_id              text        NOT NULL,
    channel             text        NOT NULL,
    mode                text        NOT NULL,
    window_from         timestamptz,
    window_until        timestamptz,
    granularity         text,
    metadata_prefix     text,
    status              text        NOT NULL,
    pages               integer     NOT NULL DEFAULT 0,
    fetched             integer     NOT NULL DEFAULT 0,
    upserted            integer     NOT NULL DEFAULT 0,
    unchanged           integer     NOT NULL DEFAULT 0,
    purged              integer     NOT NULL DEFAULT 0,
    quarantined         integer     NOT NULL DEFAULT 0,
    complete_list_size  integer,
    list_size_mismatch  boolean     NOT NULL DEFAULT false,
    token_restarts      integer     NOT NULL DEFAULT 0,
    cleaned_pages       integer     NOT NULL DEFAULT 0,
    attempts            integer     NOT NULL DEFAULT 0,
    error               text,
    started_at          timestamptz NOT NULL DEFAULT now(),
    harvested_at        timestamptz,
    applied_at          timestamptz,
    PRIMARY KEY (partner_id, run_id, channel)
);
CREATE INDEX IF NOT EXISTS harvest_runs_started_at ON harvest_runs (partner_id, started_at);

-- Per-run staging: filled page by page with COPY, merged by apply in one transaction.
-- Unlogged: a crash loses only staging, and a retry rebuilds it.
CREATE UNLOGGED TABLE IF NOT EXISTS staging (
    partner_id          text        NOT NULL,
    run_id              text        NOT NULL,
    channel             text        NOT NULL,
    seq                 bigint      NOT NULL,
    kind                "char"      NOT NULL,   -- R record, T tombstone, Q quarantine
    identifier          text        NOT NULL,
    datestamp           timestamptz,
    metadata_prefix     text,
    metadata            text,
    set_specs           text[],
    title               text,
    content_hash        text,
    reason              text
);
CREATE INDEX IF NOT EXISTS staging_run ON staging (partner_id, run_id, channel);
