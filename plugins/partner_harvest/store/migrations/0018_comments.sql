-- What each table and column means, in the database itself (psql \d+ shows it). The tables
-- reference of the docs (docs/tables.md) is generated from these comments, read from a
-- migrated database: change a meaning here and regenerate the page. COMMENT ON replaces
-- the previous comment, so this migration is idempotent.

-- ---------------------------------------------------------------- the downstream contract
COMMENT ON TABLE records IS
    'One row per live record of every partner, key (partner_id, identifier): exactly what each partner holds after its newest applied run.';
COMMENT ON COLUMN records.partner_id IS 'The registry id of the partner the record belongs to.';
COMMENT ON COLUMN records.identifier IS 'The record''s identifier at the partner (OAI-PMH header identifier; Sierra bib id without b or check digit).';
COMMENT ON COLUMN records.datestamp IS 'The partner''s version stamp of the stored version, UTC (OAI-PMH header datestamp; Sierra updatedDate or 005).';
COMMENT ON COLUMN records.metadata_prefix IS 'The format of metadata: oai_dc, lido, marc21 (Sierra and MARCXML partners), or another OAI-PMH prefix.';
COMMENT ON COLUMN records.metadata IS 'The raw XML of the payload element, with the namespace declarations it needs.';
COMMENT ON COLUMN records.set_specs IS 'The OAI-PMH sets the header lists (empty for Sierra).';
COMMENT ON COLUMN records.title IS 'The title the format''s rules extract (dc:title, the LIDO title, MARC 245), for display; NULL when there is none.';
COMMENT ON COLUMN records.content_hash IS 'A hash of the stored payload: equal hashes at equal datestamps make a re-seen version a no-op.';
COMMENT ON COLUMN records.first_harvested_at IS 'When the record first landed (our clock).';
COMMENT ON COLUMN records.harvested_at IS 'When the stored version landed (our clock). Not part of the change-feed contract: read by change_seq.';
COMMENT ON COLUMN records.run_id IS 'The run that stored this version: harvest_runs.run_id, <dag_id>/<Airflow run id>.';
COMMENT ON COLUMN records.observed_at IS 'When the stored version was staged: the tie-breaker of versions with equal datestamps (the later observation wins).';
COMMENT ON COLUMN records.change_seq IS 'The change-feed number of the row''s newest change (insert, or update to a newer version); see partner_feed.high_water.';
COMMENT ON COLUMN records.regressed_clock IS 'Set when the version came from a run whose partner clock had gone back (clock_regressed): that clock, which orders this version against versions stamped after it.';
COMMENT ON COLUMN records.warnings IS 'What is odd but usable about the stored version: jsonb {check name: message} (docs/operator/validation.md), or NULL.';

COMMENT ON TABLE deletions IS
    'One row per purge of a record: the change feed''s deletions. Rows are never updated; forget writes the records it removes here too (reason forgotten).';
COMMENT ON COLUMN deletions.id IS 'A surrogate key; order by change_seq, not by id.';
COMMENT ON COLUMN deletions.partner_id IS 'The registry id of the partner.';
COMMENT ON COLUMN deletions.identifier IS 'The identifier of the purged record.';
COMMENT ON COLUMN deletions.upstream_datestamp IS 'The stamp of the deletion (OAI-PMH deleted header; Sierra deletedDate, at the last microsecond of its day); for a reconcile purge the deletion''s stamp or the stored record''s datestamp, for forget the stored record''s datestamp.';
COMMENT ON COLUMN deletions.deleted_at IS 'When the purge was applied (our clock). Not part of the change-feed contract.';
COMMENT ON COLUMN deletions.run_id IS 'The run that purged: harvest_runs.run_id, or the forget command''s run id.';
COMMENT ON COLUMN deletions.reason IS 'tombstone (the partner announced the deletion), reconcile (the weekly reconcile found the record gone) or forgotten (partner-harvest forget).';
COMMENT ON COLUMN deletions.change_seq IS 'The change-feed number of this purge.';

COMMENT ON TABLE partner_feed IS
    'Per partner, how far its committed changes reach: every change with change_seq <= high_water is visible. Read up to it, never up to the greatest change_seq seen.';
COMMENT ON COLUMN partner_feed.partner_id IS 'The registry id of the partner.';
COMMENT ON COLUMN partner_feed.high_water IS 'Every change of the partner with change_seq <= high_water is committed and visible.';
COMMENT ON COLUMN partner_feed.run_id IS 'The apply (or forget) that last raised the high water.';
COMMENT ON COLUMN partner_feed.updated_at IS 'When the high water last moved (our clock).';

COMMENT ON TABLE feed_positions IS
    'Where each change-feed consumer stands, per partner (the example downstream DAG keeps its position here, next to the data it points into).';
COMMENT ON COLUMN feed_positions.consumer IS 'The consumer''s name, e.g. example_downstream_jsonl.';
COMMENT ON COLUMN feed_positions.partner_id IS 'The registry id of the partner.';
COMMENT ON COLUMN feed_positions.position IS 'The change_seq up to which the consumer has stored the changes durably.';
COMMENT ON COLUMN feed_positions.pending_until IS 'The end of the range the consumer is exporting now (committed before it writes); NULL when none is pending.';
COMMENT ON COLUMN feed_positions.updated_at IS 'When the row last changed (our clock).';

COMMENT ON TABLE quarantine IS
    'Every rejected record of every run: the per-run log of what failed validation or could not be stored (quarantine_current shows what is broken now).';
COMMENT ON COLUMN quarantine.id IS 'A surrogate key.';
COMMENT ON COLUMN quarantine.partner_id IS 'The registry id of the partner.';
COMMENT ON COLUMN quarantine.identifier IS 'The rejected record''s identifier (as far as it could be read).';
COMMENT ON COLUMN quarantine.datestamp IS 'The rejected version''s stamp, when it could be read.';
COMMENT ON COLUMN quarantine.metadata_prefix IS 'The format the record was validated as.';
COMMENT ON COLUMN quarantine.reason IS 'Why it was rejected, in one line (the failed check, or what PostgreSQL cannot store).';
COMMENT ON COLUMN quarantine.raw_payload IS 'The record as it came (the whole OAI-PMH <record>, Sierra MARC with invalid bytes escaped as \xNN; the first 64 KiB of an oversized one).';
COMMENT ON COLUMN quarantine.run_id IS 'The run that rejected it.';
COMMENT ON COLUMN quarantine.quarantined_at IS 'When the apply wrote the row (our clock).';
COMMENT ON COLUMN quarantine.observed_at IS 'When the rejected version was staged; compared with records.observed_at by quarantine_current.';

COMMENT ON VIEW quarantine_current IS
    'What is broken right now: the newest reject per record, unless a valid version of it was harvested later.';

-- --------------------------------------------------------------------- the run audit
COMMENT ON TABLE harvest_runs IS
    'One row per run and channel (changes, Sierra deletions, reconcile; a sliced run adds changes/001, ...): what was asked, what came back, what was applied.';
COMMENT ON COLUMN harvest_runs.partner_id IS 'The registry id of the partner.';
COMMENT ON COLUMN harvest_runs.run_id IS 'The run: <dag_id>/<Airflow run id>.';
COMMENT ON COLUMN harvest_runs.channel IS 'changes, deletions (the Sierra deletion poll), reconcile, or a slice changes/NNN; a sliced run''s changes row is the parent (fetched 0).';
COMMENT ON COLUMN harvest_runs.mode IS 'incremental (from the cursor; moves it), full (everything) or window (given bounds; a backfill run too).';
COMMENT ON COLUMN harvest_runs.window_from IS 'The frozen lower bound (NULL: a full harvest), or a slice''s own lower bound.';
COMMENT ON COLUMN harvest_runs.window_until IS 'The frozen upper bound: the partner''s clock when the window was frozen, or a slice''s own upper bound.';
COMMENT ON COLUMN harvest_runs.granularity IS 'The partner''s datestamp granularity the window is written at (seconds or day).';
COMMENT ON COLUMN harvest_runs.metadata_prefix IS 'The metadata prefix harvested.';
COMMENT ON COLUMN harvest_runs.status IS 'planned, harvesting, waiting (rescheduled: the partner asked us to come back; error says when), harvested, applied, failed or abandoned.';
COMMENT ON COLUMN harvest_runs.pages IS 'Pages (or Sierra blocks) staged so far.';
COMMENT ON COLUMN harvest_runs.fetched IS 'Items fetched and staged; after the apply fetched = upserted + unchanged + purged + quarantined.';
COMMENT ON COLUMN harvest_runs.upserted IS 'Records inserted or replaced by a newer version.';
COMMENT ON COLUMN harvest_runs.unchanged IS 'Items that changed nothing: versions already held, tombstones of records never held, superseded duplicates, versions older than the stored one.';
COMMENT ON COLUMN harvest_runs.purged IS 'Records removed (each also a deletions row).';
COMMENT ON COLUMN harvest_runs.quarantined IS 'Records rejected (each also a quarantine row).';
COMMENT ON COLUMN harvest_runs.complete_list_size IS 'The completeListSize the OAI-PMH repository announced, when it did.';
COMMENT ON COLUMN harvest_runs.list_size_mismatch IS 'True when completeListSize differs from what was fetched.';
COMMENT ON COLUMN harvest_runs.token_restarts IS 'Restarts of the window after an expired resumptionToken (badResumptionToken).';
COMMENT ON COLUMN harvest_runs.cleaned_pages IS 'Pages from which characters XML 1.0 forbids were stripped.';
COMMENT ON COLUMN harvest_runs.attempts IS 'Tries of the channel''s harvest.';
COMMENT ON COLUMN harvest_runs.error IS 'The failure (or, while waiting, when the partner asked us to come back), in one line naming the partner, the request and the cause.';
COMMENT ON COLUMN harvest_runs.started_at IS 'When the row was written first (our clock).';
COMMENT ON COLUMN harvest_runs.harvested_at IS 'When the channel finished harvesting.';
COMMENT ON COLUMN harvest_runs.applied_at IS 'When the run''s apply committed.';
COMMENT ON COLUMN harvest_runs.check_kind IS 'The completeness check that ran: oai-complete-list-size, oai-list-identifiers or sierra-id-enumeration; NULL when none did.';
COMMENT ON COLUMN harvest_runs.check_expected IS 'What the check''s witness says the run should hold; NULL when the witness itself failed.';
COMMENT ON COLUMN harvest_runs.check_found IS 'What the run fetched, as the check counts it.';
COMMENT ON COLUMN harvest_runs.check_ok IS 'The check''s result; NULL: no check ran. A failed check alerts but never blocks the apply.';
COMMENT ON COLUMN harvest_runs.check_detail IS 'Both counts in words, with the request.';
COMMENT ON COLUMN harvest_runs.records_held IS 'Records the partner held after the run applied (the health page''s chart; the purge-spike check).';
COMMENT ON COLUMN harvest_runs.change_seq_after IS 'The run''s changes are the partner''s rows with change_seq_after < change_seq <= change_seq_until (same on all its channels).';
COMMENT ON COLUMN harvest_runs.change_seq_until IS 'See change_seq_after.';
COMMENT ON COLUMN harvest_runs.partner_clock IS 'The partner''s own clock when the window was frozen; the next window starts from min(until, partner_clock).';
COMMENT ON COLUMN harvest_runs.slice_lo IS 'A Sierra id-range slice''s lowest bib id (NULL for other channels).';
COMMENT ON COLUMN harvest_runs.slice_hi IS 'A Sierra id-range slice''s highest bib id; NULL for the open-ended last slice and other channels.';
COMMENT ON COLUMN harvest_runs.progress_at IS 'When the channel last staged a page (a slice whose last page is long ago is stuck).';
COMMENT ON COLUMN harvest_runs.checkpoint IS 'The keyset position a Sierra slice resumes from after a failed try.';
COMMENT ON COLUMN harvest_runs.resumed IS 'How often a Sierra slice resumed from its checkpoint.';
COMMENT ON COLUMN harvest_runs.expected IS 'How many items the channel should bring (the plan''s estimate, then the announced completeListSize; Sierra: the slice''s id span), for the time left.';
COMMENT ON COLUMN harvest_runs.harvesting_since IS 'When the channel''s latest try began harvesting (a slice may wait in the pool long after the run started).';
COMMENT ON COLUMN harvest_runs.clock_regressed IS 'True when the partner''s clock was behind the highest clock or record stamp seen by more than the lag: its versions beat those stamped after that clock by observation.';
COMMENT ON COLUMN harvest_runs.max_datestamp IS 'The latest stamp among the records the run applied: part of the clock high water.';
COMMENT ON COLUMN harvest_runs.slice_set IS 'The OAI-PMH set an OAI set slice harvests (registry slicing.sets); NULL otherwise.';
COMMENT ON COLUMN harvest_runs.warnings IS 'Records landed per warning check: jsonb {check name: count}.';
COMMENT ON COLUMN harvest_runs.staged_bytes IS 'Payload bytes the channel staged; a run''s sum may not pass options.limits.max_run_bytes.';

COMMENT ON TABLE run_events IS
    'What a harvest run''s tasks said when they did not harvest: failed tries, last tries, skipped and empty runs (written by the task callbacks; read by the health page and partner-harvest status).';
COMMENT ON COLUMN run_events.id IS 'A surrogate key.';
COMMENT ON COLUMN run_events.partner_id IS 'The registry id of the partner.';
COMMENT ON COLUMN run_events.dag_id IS 'The DAG of the run (harvest_<id> or reconcile_<id>).';
COMMENT ON COLUMN run_events.run_id IS 'The run: <dag_id>/<Airflow run id>, as harvest_runs.run_id.';
COMMENT ON COLUMN run_events.task_id IS 'The task that reported.';
COMMENT ON COLUMN run_events.try_number IS 'The task''s try.';
COMMENT ON COLUMN run_events.kind IS 'retry (a failed try; another follows), failed (the last try failed), skipped (a first scheduled run without a cursor), empty (a window after the partner''s clock).';
COMMENT ON COLUMN run_events.message IS 'The error or the reason, in one line (as the alert carries it).';
COMMENT ON COLUMN run_events.at IS 'When it was written (our clock).';

COMMENT ON TABLE partner_stats IS
    'Per partner counters kept in step by the apply transaction, so the health page never counts records.';
COMMENT ON COLUMN partner_stats.partner_id IS 'The registry id of the partner.';
COMMENT ON COLUMN partner_stats.records_held IS 'count(*) of the partner''s records.';
COMMENT ON COLUMN partner_stats.quarantined_now IS 'count(*) of the partner''s quarantine_current rows.';
COMMENT ON COLUMN partner_stats.updated_at IS 'When the counters last changed.';

-- ----------------------------------------------------------- the store's own bookkeeping
COMMENT ON TABLE tombstones IS
    'The newest remembered deletion of every purged identifier, so a late apply of an older run never brings a purged record back; dropped when a newer version lands.';
COMMENT ON COLUMN tombstones.partner_id IS 'The registry id of the partner.';
COMMENT ON COLUMN tombstones.identifier IS 'The purged identifier.';
COMMENT ON COLUMN tombstones.datestamp IS 'The deletion''s stamp (a reconcile''s vanished record keeps the stored datestamp).';
COMMENT ON COLUMN tombstones.observed_at IS 'When the deletion was staged.';
COMMENT ON COLUMN tombstones.run_id IS 'The run that purged.';
COMMENT ON COLUMN tombstones.regressed_clock IS 'The partner clock of a clock_regressed run that staged the deletion; NULL otherwise.';

COMMENT ON TABLE partner_leases IS
    'Who works on a partner now: harvest runs share a lease, a reconcile holds it alone. Renewed while a task runs; it lapses one TTL after its holder died.';
COMMENT ON COLUMN partner_leases.partner_id IS 'The registry id of the partner.';
COMMENT ON COLUMN partner_leases.holder IS 'The run holding it: <dag_id>/<Airflow run id>.';
COMMENT ON COLUMN partner_leases.kind IS 'harvest or reconcile.';
COMMENT ON COLUMN partner_leases.acquired_at IS 'When this tenure began.';
COMMENT ON COLUMN partner_leases.expires_at IS 'When the lease lapses unless renewed (HARVEST_LEASE_TTL_SECONDS, default 300 s).';
COMMENT ON COLUMN partner_leases.token IS 'The tenure''s fencing token (it only grows per partner): every protected write checks it.';

COMMENT ON TABLE partner_fences IS
    'Per partner: the last fencing token handed out and the epoch that every operator command changing the partner''s state bumps (docs/design/fences.md).';
COMMENT ON COLUMN partner_fences.partner_id IS 'The registry id of the partner.';
COMMENT ON COLUMN partner_fences.last_token IS 'The last lease token handed out (never reset, not even by forget).';
COMMENT ON COLUMN partner_fences.epoch IS 'Bumped by forget and reset-cursor: a run planned under an older epoch never writes.';
COMMENT ON COLUMN partner_fences.epoch_command IS 'The command that set the epoch, e.g. forget.';
COMMENT ON COLUMN partner_fences.epoch_at IS 'When it did.';

COMMENT ON TABLE staging IS
    'Internal. Per run and channel, what the harvest fetched (records, tombstones, rejects), filled page by page with COPY and merged by the apply. UNLOGGED: a crash empties it and the apply harvests again.';
COMMENT ON TABLE reconcile_ids IS
    'Internal. The identifiers a reconcile''s sweep listed, staged in the database rather than in memory.';
COMMENT ON TABLE schema_migrations IS
    'Internal. The migrations applied to this database (partner-harvest migrate --check compares them with the code''s).';
COMMENT ON COLUMN schema_migrations.name IS 'The migration file, e.g. 0018_comments.sql.';
COMMENT ON COLUMN schema_migrations.applied_at IS 'When it was applied.';
COMMENT ON SEQUENCE change_seq IS
    'The change-feed numbers, shared by all partners: records.change_seq and deletions.change_seq. Numbers have gaps.';
