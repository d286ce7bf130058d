-- One alert for an outage many partners share. A task failure opens a
-- group for its key (the endpoint host and the error's type) and is alerted at once; the
-- failures of the same key in the next minutes join the group as members without an alert
-- of their own, and one digest naming them is sent when the group's fold window ends, by
-- whichever process claims it first (a fenced claim: claim_epoch goes up with each claim,
-- and only the holder of the current epoch may mark the digest sent).
CREATE TABLE IF NOT EXISTS alert_groups (
    id              bigserial   PRIMARY KEY,
    group_key       text        NOT NULL,
    opened_at       timestamptz NOT NULL DEFAULT now(),
    fold_until      timestamptz NOT NULL,
    first_partner   text        NOT NULL,
    claim_holder    text,
    claim_until     timestamptz,
    claim_epoch     bigint      NOT NULL DEFAULT 0,
    digest_sent_at  timestamptz,
    closed_at       timestamptz
);
CREATE INDEX IF NOT EXISTS alert_groups_key_opened ON alert_groups (group_key, opened_at DESC);
CREATE INDEX IF NOT EXISTS alert_groups_due ON alert_groups (fold_until) WHERE closed_at IS NULL;

CREATE TABLE IF NOT EXISTS alert_group_members (
    id          bigserial   PRIMARY KEY,
    group_id    bigint      NOT NULL REFERENCES alert_groups (id) ON DELETE CASCADE,
    partner_id  text        NOT NULL,
    alerted     boolean     NOT NULL,  -- the group's first failure, alerted at once
    fields      jsonb       NOT NULL,  -- the alert's fields (notifiers.failure_fields): dag, task, run, cause, log
    at          timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS alert_group_members_group ON alert_group_members (group_id);

COMMENT ON TABLE alert_groups IS
    'Failure alerts grouped by cause: one per endpoint host and error type within a fold window; the first failure is alerted at once, the rest in one digest (docs/operator/alerts.md).';
COMMENT ON COLUMN alert_groups.group_key IS 'What the group''s failures share: <endpoint host>|<error type>.';
COMMENT ON COLUMN alert_groups.opened_at IS 'When the group''s first failure was recorded.';
COMMENT ON COLUMN alert_groups.fold_until IS 'Failures of the same key until then join the group; the digest is due after it.';
COMMENT ON COLUMN alert_groups.first_partner IS 'The partner whose failure opened the group (alerted at once).';
COMMENT ON COLUMN alert_groups.claim_holder IS 'The process that claimed the digest (host:pid), while it sends.';
COMMENT ON COLUMN alert_groups.claim_until IS 'The claim expires then: another process may claim the digest again.';
COMMENT ON COLUMN alert_groups.claim_epoch IS 'Raised by every claim: only the holder of the current epoch marks the digest sent (the fence).';
COMMENT ON COLUMN alert_groups.digest_sent_at IS 'When the digest went out; NULL when none was due (no failure joined) or not yet.';
COMMENT ON COLUMN alert_groups.closed_at IS 'When the group was settled (digest sent, or nothing to send).';
COMMENT ON TABLE alert_group_members IS 'Each failure of a group: the first (alerted at once) and the folded ones the digest names.';
COMMENT ON COLUMN alert_group_members.group_id IS 'The group (alert_groups.id).';
COMMENT ON COLUMN alert_group_members.partner_id IS 'The failing partner.';
COMMENT ON COLUMN alert_group_members.alerted IS 'True for the failure that was alerted at once (the group''s first).';
COMMENT ON COLUMN alert_group_members.fields IS 'The failure''s alert fields: partner, dag_id, task_id, try_number, run_id, window, cause, log_url.';
COMMENT ON COLUMN alert_group_members.at IS 'When the failure was recorded.';
