-- Politeness per endpoint host (docs/operator/politeness.md): every process that talks to a
-- host reserves its request's slot here, so slices, tasks and workers pace one host together.
CREATE TABLE IF NOT EXISTS host_pacing (
    host            text        PRIMARY KEY,
    next_slot       timestamptz NOT NULL DEFAULT now(),
    penalty_ms      double precision NOT NULL DEFAULT 0 CHECK (penalty_ms >= 0),
    strained_at     timestamptz,
    strains         bigint      NOT NULL DEFAULT 0,
    last_gap_ms     double precision NOT NULL DEFAULT 0,
    window_start    timestamptz NOT NULL DEFAULT now(),
    window_requests integer     NOT NULL DEFAULT 0,
    last_rate       double precision,
    updated_at      timestamptz NOT NULL DEFAULT now()
);

-- Which host each partner was last paced at, with its registry delay: the health page's join.
CREATE TABLE IF NOT EXISTS partner_pacing (
    partner_id  text        PRIMARY KEY,
    host        text        NOT NULL,
    delay_ms    integer     NOT NULL CHECK (delay_ms >= 0),
    seen_at     timestamptz NOT NULL DEFAULT now()
);

COMMENT ON TABLE host_pacing IS
    'One row per endpoint host that a paced request went to: the next free request slot, shared by every slice, task and worker talking to the host, and its adaptive back-off.';
COMMENT ON COLUMN host_pacing.host IS 'The endpoint host name, lowercased, without scheme or port (partners on one machine share it).';
COMMENT ON COLUMN host_pacing.next_slot IS 'The earliest moment the next request to the host may start; each reservation moves it on by its gap.';
COMMENT ON COLUMN host_pacing.penalty_ms IS 'The adaptive back-off in milliseconds: doubled on a slow or failed response, shrunk by each healthy one.';
COMMENT ON COLUMN host_pacing.strained_at IS 'When a response to the host was last slow or failed.';
COMMENT ON COLUMN host_pacing.strains IS 'Slow or failed responses counted since the row was created.';
COMMENT ON COLUMN host_pacing.last_gap_ms IS 'The gap in milliseconds the newest reservation kept before the next request: the larger of the requesting partner''s request_delay and the back-off.';
COMMENT ON COLUMN host_pacing.window_start IS 'Start of the current minute of counted reservations.';
COMMENT ON COLUMN host_pacing.window_requests IS 'Reservations since window_start.';
COMMENT ON COLUMN host_pacing.last_rate IS 'Requests per second reserved in the last complete counting window (a minute or more).';
COMMENT ON COLUMN host_pacing.updated_at IS 'When the row last changed.';
COMMENT ON TABLE partner_pacing IS
    'The host each partner''s paced requests went to, and the partner''s request_delay then: how the health page finds a partner''s effective rate.';
COMMENT ON COLUMN partner_pacing.partner_id IS 'The registry id of the partner.';
COMMENT ON COLUMN partner_pacing.host IS 'The endpoint host (host_pacing.host) the partner''s requests are paced at.';
COMMENT ON COLUMN partner_pacing.delay_ms IS 'The partner''s request_delay in milliseconds when it was last paced.';
COMMENT ON COLUMN partner_pacing.seen_at IS 'When a session of the partner last started pacing.';
