-- What `metadata_prefix: auto` chose for an OAI-PMH partner, and when the partner was last
-- asked (ListMetadataFormats). A nightly run uses the choice while it is fresh instead of
-- asking every night; a full harvest, or a choice older than the re-check
-- interval, asks again. A memo, not state a lease protects: losing it costs one request.
CREATE TABLE IF NOT EXISTS metadata_prefix_choices (
    partner_id       text        PRIMARY KEY,
    metadata_prefix  text        NOT NULL,
    checked_at       timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE metadata_prefix_choices IS
    'The metadata prefix `metadata_prefix: auto` chose per OAI-PMH partner and when ListMetadataFormats was last asked; runs re-ask when it is older than the re-check interval (docs/operator/many-partners.md).';
COMMENT ON COLUMN metadata_prefix_choices.partner_id IS 'The registry id of the partner.';
COMMENT ON COLUMN metadata_prefix_choices.metadata_prefix IS 'The prefix chosen (lido when advertised, else oai_dc).';
COMMENT ON COLUMN metadata_prefix_choices.checked_at IS 'When the partner''s ListMetadataFormats was last asked.';
