"""Break one guard at a time and check that the tests said to guard it fail.

Not a test module (no ``test_`` prefix: pytest never collects it). Each mutation is a
text substitution in one library file; the script applies it, runs the named tests,
restores the file byte for byte (also on Ctrl-C), and reports:

    CAUGHT    the tests failed on the broken code (what we want)
    MISSED    the tests still passed: the guard is not pinned
    STALE     the text to break is not in the file exactly once any more (an indented
              text counts only at the start of a line): the code moved on; update the
              mutation and tests/INVARIANTS.md

Usage (from the repository root):

    .venv/bin/python tests/mutation_check.py            # every mutation
    .venv/bin/python tests/mutation_check.py I1 I6-...  # only these ids (prefix match)
    .venv/bin/python tests/mutation_check.py --list

Never leave a mutated file behind: the script restores in ``finally``; if it is killed
with SIGKILL, ``git diff plugins/`` shows what to restore.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIB = "plugins/partner_harvest/"


@dataclass(frozen=True)
class Mutation:
    id: str
    file: str  # under plugins/partner_harvest/
    edits: tuple[tuple[str, str], ...]  # (text that must occur exactly once, its replacement)
    tests: tuple[str, ...]
    what: str


def M(id: str, file: str, find: str, replace: str, tests: tuple[str, ...], what: str) -> Mutation:
    return Mutation(id, file, ((find, replace),), tests, what)


GUARDS = "tests/integration/test_guards.py::"
LAYERS = "tests/unit/test_xmlsafe_layers.py::"
APPLY = "tests/integration/test_store_apply.py::"
OAI = "tests/integration/test_oai_harvest.py::"
DAG = "tests/dags/test_harvest_dag_run.py::"
MIRROR = "tests/integration/test_mirror_store.py::"
SIERRA = "tests/integration/test_sierra_harvest.py::"
SLICES = "tests/integration/test_slices.py::"
IIIF_SLICES = "tests/integration/test_iiif_slices.py::"
FENCES = "tests/integration/test_fences.py::"
FENCE_DAG = "tests/dags/test_fences_dag.py::"
CAPS = "tests/integration/test_caps.py::"
BOUNDARIES = "tests/integration/test_slice_boundaries.py::"

MUTATIONS: tuple[Mutation, ...] = (
    # I1 -- the cursor
    M("I1-never-backwards", "run.py",
      "    target = next_cursor(current, window)\n", "    target = window.until\n",
      ("tests/dags/test_cursor_monotonic.py::test_an_older_run_applying_after_a_newer_one_keeps_the_newer_cursor",),
      "the cursor move writes window.until unconditionally"),
    M("I1-only-incremental-plan", "window.py",
      "    if not window.advances_cursor:\n        return current\n", "",
      ("tests/unit/test_window.py::test_cursor_moves_forward_only",),
      "next_cursor ignores advances_cursor (window/full/backfill runs move the cursor)"),
    M("I1-only-incremental-write", "run.py",
      "    if not window.advances_cursor:\n        log.info(", "    if False:\n        log.info(",
      ("tests/dags/test_cursor_monotonic.py::test_a_full_or_window_run_leaves_an_unset_cursor_unset",),
      "the cursor move no longer checks the run's mode itself (relies on next_cursor alone)"),
    M("I1-after-apply", "airflow/dag_factory.py",
      "        advance_cursor(window, applied)\n", "        advance_cursor(window, {})\n",
      (DAG + "test_failed_apply_keeps_the_cursor_and_a_rerun_completes",),
      "advance_cursor no longer waits for apply_changes"),
    # I2 -- monotonic, idempotent upserts
    M("I2-older-never-overwrites", "store/apply.py",
      "  AND harvest_version_newer(b.datestamp, b.observed_at, b.regressed_clock,\n"
      "                            r.datestamp, r.observed_at, r.regressed_clock)\n", "",
      (APPLY + "test_older_version_never_overwrites_newer",),
      "the upsert lands whatever the stored datestamp"),
    M("I2-replay-is-a-no-op", "store/apply.py",
      "  AND (r.datestamp <> b.datestamp OR r.content_hash <> b.content_hash)\n",
      "  AND true\n",
      (APPLY + "test_replaying_a_window_changes_nothing", OAI + "test_replaying_the_same_window_changes_nothing"),
      "a same-datestamp, same-content upsert rewrites the row"),
    M("I2-update-skipped-only-on-a-first-load", "store/apply.py",
      "        holds_records, holds_tombstones, records_held = one(conn.execute(_HOLDS, params))\n",
      "        holds_records, holds_tombstones, records_held = False, False, 0\n",
      (APPLY + "test_a_first_load_remembers_its_tombstones_and_a_reload_updates_and_purges",),
      "every apply is taken for a first load: no update, no purge, a plain insert"),
    # I3 -- guarded tombstones, recorded deletions
    M("I3-tombstone-not-older", "store/apply.py",
      "      AND NOT harvest_version_newer(r.datestamp, r.observed_at, r.regressed_clock,\n"
      "                                    b.datestamp, b.observed_at, b.regressed_clock)\n    RETURNING",
      "\n    RETURNING",
      (APPLY + "test_tombstone_older_than_stored_version_does_not_purge",),
      "a tombstone purges whatever the stored version's datestamp"),
    M("I3-deletion-recorded", "store/apply.py",
      "    FROM gone\n), kept AS (", "    FROM gone WHERE false\n), kept AS (",
      (OAI + "test_full_then_incremental_matches_live_set",),
      "purged records are no longer written to the deletions log"),
    # I4 -- one transaction
    Mutation("I4-one-transaction", "store/apply.py", (
        ("CREATE TEMP TABLE apply_batch ON COMMIT DROP AS", "CREATE TEMP TABLE apply_batch AS"),
        ("        upserted = Counter(updated) + Counter(inserted) + Counter(moved)\n",
         "        upserted = Counter(updated) + Counter(inserted) + Counter(moved)\n"
         "        conn.execute('COMMIT')\n        conn.execute('BEGIN')\n"),
    ), (APPLY + "test_failed_apply_leaves_nothing_half_applied",),
        "the upserts commit on their own, before the purge"),
    # I5 -- bounded memory
    M("I5-page-by-page", "oai/harvester.py",
      "            sink.write_page(items)\n",
      "            held_back = locals().get('held_back') or []\n"
      "            held_back.extend(items)\n"
      "            if not page.token:\n"
      "                sink.write_page(held_back)\n",
      (GUARDS + "test_each_page_is_staged_before_the_next_is_requested",),
      "the harvest holds the whole window and stages it at the end"),
    # I6 -- accounting
    M("I6-restart-resets-staging", "oai/harvester.py",
      "                sink.reset()\n                stats.reset()\n                stats.restarts = restarts\n",
      "                stats.reset()\n                stats.restarts = restarts\n",
      (GUARDS + "test_a_token_restart_stages_the_window_once",),
      "a token restart keeps the broken attempt's staging"),
    M("I6-sweep-restart-resets", "oai/harvester.py",
      "                sink.reset()\n                stats.reset()\n\n",
      "                stats.reset()\n\n",
      (GUARDS + "test_a_token_restart_in_the_reconcile_sweep_forgets_the_broken_attempt",),
      "a token restart in the reconcile sweep keeps the broken attempt's id list"),
    M("I6-unchanged-counted", "store/apply.py",
      "unchanged=n - upserted.get(channel, 0) - purged.get(channel, 0) - quarantined.get(channel, 0),",
      "unchanged=n - upserted.get(channel, 0) - purged.get(channel, 0),",
      (GUARDS + "test_a_token_restart_stages_the_window_once",),
      "quarantined items are counted as unchanged too"),
    # I7 -- continuation requests
    M("I7-token-only", "oai/client.py",
      '    return {"verb": params["verb"], "resumptionToken": token}\n',
      '    return {**params, "resumptionToken": token}\n',
      (OAI + "test_continuations_carry_verb_and_token_only",),
      "continuations repeat the first request's arguments"),
    # I8 -- quarantine
    M("I8-rejects-quarantined", "store/apply.py",
      "WHERE partner_id = %(pid)s AND run_id = %(run)s AND kind = 'Q'\nORDER BY seq\n",
      "WHERE partner_id = %(pid)s AND run_id = %(run)s AND kind = 'Q' AND false\nORDER BY seq\n",
      (OAI + "test_invalid_records_are_quarantined_and_the_rest_lands",),
      "rejected records are dropped instead of quarantined"),
    # I9 -- bad and hostile input, each XML layer alone
    M("I9-xml-no-entity-resolution", "xmlsafe.py",
      "        resolve_entities=False,\n", "        resolve_entities=True,\n",
      (LAYERS + "test_the_parser_never_reads_an_external_entity",),
      "the parser resolves entities (every other layer stays on)"),
    M("I9-xml-no-dtd-loading", "xmlsafe.py",
      "        load_dtd=False,\n", "        load_dtd=True,\n",
      (LAYERS + "test_the_parser_never_loads_an_external_dtd",),
      "the parser loads external DTDs (every other layer stays on)"),
    M("I9-xml-byte-scan", "xmlsafe.py",
      "    _refuse_entity_declarations(content)\n    _refuse_too_many_nodes(", "    _refuse_too_many_nodes(",
      (LAYERS + "test_the_byte_scan_refuses_before_the_parser_runs",),
      "no byte scan before parsing (every other layer stays on)"),
    M("I9-xml-after-parse-check", "xmlsafe.py",
      "    if dtd is not None and any(True for _ in dtd.iterentities()):\n", "    if False:\n",
      (LAYERS + "test_the_after_parse_check_refuses_what_the_byte_scan_cannot_read",),
      "no check of the parsed DTD (every other layer stays on)"),
    M("I9-xml-expansion-named", "xmlsafe.py",
      "    if _EXPANSION_ATTACK.search(message):\n", "    if False:\n",
      (LAYERS + "test_an_expansion_stopped_by_libxml2_is_named_hostile",),
      "libxml2's amplification guard is reported as mere malformed XML"),
    M("I9-html-sniff", "xmlsafe.py",
      "    if _HTML_START.match(head.lower()):\n", "    if False:\n",
      (LAYERS + "test_the_html_sniff_names_pages_without_an_html_element",),
      "HTML error pages are no longer recognised before parsing"),
    M("I9-error-names-partner", "oai/client.py",
      "    def describe(self, params: dict[str, str]) -> str:\n",
      "    def describe(self, params: dict[str, str]) -> str:\n        return ''\n",
      (OAI + "test_persistent_5xx_fails_naming_partner_and_request",),
      "errors no longer name the request"),
    # I10 -- the outcome does not depend on the order in which runs apply
    M("I10-purges-remembered", "store/apply.py",
      "                                    t.datestamp, t.observed_at, t.regressed_clock))\"\"\"\n",
      "                                    t.datestamp, t.observed_at, t.regressed_clock) AND false)\"\"\"\n",
      (MIRROR + "test_a_late_apply_of_an_older_run_never_resurrects_a_purged_record",
       MIRROR + "test_any_apply_order_gives_the_same_mirror"),
      "remembered purges no longer stop an older record from landing"),
    M("I10-first-load-path-only-without-tombstones", "store/apply.py",
      "        if holds_records or holds_tombstones:\n", "        if holds_records:\n",
      (MIRROR + "test_a_late_apply_of_an_older_run_never_resurrects_a_purged_record",),
      "a partner holding only remembered purges is loaded without the anti-joins: an older record lands"),
    M("I10-later-observation-wins", "store/apply.py",
      "  AND harvest_version_newer(b.datestamp, b.observed_at, b.regressed_clock,\n"
      "                            r.datestamp, r.observed_at, r.regressed_clock)\n",
      "  AND r.datestamp <= b.datestamp\n",
      (MIRROR + "test_an_older_same_day_version_never_replaces_newer_content",),
      "at equal datestamps any different content replaces the stored one (apply order decides)"),
    M("I10-clock-regression-observation-wins", "store/migrations/0019_version_order_after_a_clock_jump.sql",
      "WHEN (n_rc IS NOT NULL AND s_ds > n_rc) OR (s_rc", "WHEN (s_rc",
      (MIRROR + "test_after_a_clock_jump_the_later_observation_wins_in_any_apply_order",
       "tests/soak/test_soak_findings.py::test_versions_stamped_before_the_held_ones_after_a_clock_jump_reach_the_mirror"),
      "after a partner clock went back, versions stamped before held ones lose (stale content, kept deletions)"),
    M("I10-clock-regression-either-way", "store/migrations/0019_version_order_after_a_clock_jump.sql",
      "OR (s_rc IS NOT NULL AND n_ds > s_rc)", "OR false",
      ("tests/soak/test_soak_findings.py::test_a_version_stamped_while_the_clock_was_behind_beats_one_stamped_before_the_jump",),
      "a version stamped while the clock was behind, harvested after it caught up, loses to one stamped before the jump"),
    M("I10-clock-high-water-counts-stamps", "store/runs.py",
      "GREATEST(max(partner_clock), max(max_datestamp))", "max(partner_clock)",
      ("tests/soak/test_soak_findings.py::test_a_clock_behind_stamps_a_full_export_already_held_is_a_regression_too",),
      "a clock past every clock read but behind stamps already held is not seen as set back"),
    M("I10-vanished-keeps-its-datestamp", "store/reconcile.py",
      "COALESCE(d.datestamp, r.datestamp)", "COALESCE(d.datestamp, now())",
      (MIRROR + "test_a_record_purged_by_a_reconcile_comes_back_when_the_partner_lists_it_again",),
      "a reconcile's purge is dated at the reconcile's clock and blocks the record's return"),
    # I11 -- nothing blocks a partner forever
    M("I11-lease-renewed", "store/leases.py",
      "        self._thread.start()\n", "\n",
      ("tests/integration/test_leases.py::test_a_killed_holder_releases_the_partner_within_one_ttl",),
      "the lease is never renewed (a long task loses it; or, with a long TTL, a dead one keeps it)"),
    M("I11-unstorable-quarantined", "store/staging.py",
      "stored = storable(item, limit)", "stored = item",
      (MIRROR + "test_what_postgresql_cannot_store_is_quarantined_and_the_page_lands",),
      "a NUL, a lone surrogate or a long identifier reaches COPY and fails every retry"),
    # I12 -- completeness by a second witness
    M("I12-staged-equals-harvested", "store/apply.py",
      "    if lost:\n        raise StagingIncomplete", "    if False:\n        raise StagingIncomplete",
      (MIRROR + "test_apply_refuses_when_staging_lost_what_the_harvest_recorded",),
      "an apply over staging the database lost marks the run applied with nothing"),
    M("I4-slices-planned-block-the-apply", "store/slices.py",
      "'planned', 0, %s, %s, %s, %s, %s, %s, %s, NULL)", "'planned', 0, %s, %s, %s, %s, %s, %s, %s, now())",
      (SLICES + "test_oai_full_harvest_as_slices_equals_the_live_set",),
      "planned slices count as harvested: a sliced run applies before its slices harvested"),
    M("I12-run-batch-used-only-while-whole", "store/run_batch.py",
      "    if held != counted or stale:\n", "    if False:\n",
      ("tests/integration/test_slice_lanes.py::test_a_stale_or_lost_batch_is_built_again_from_staging",),
      "the apply reads a sliced run's batch although a slice was harvested again after its merge, or a crash "
      "emptied the batch: the run applies an earlier try's versions, or nothing"),
    M("I4-a-slice-taken-by-one-lane", "store/lanes.py",
      "OR (lane IS NULL AND status = 'planned'))", "OR (status = 'planned'))",
      ("tests/integration/test_slice_lanes.py::test_lanes_take_the_slices_between_them_and_the_merged_batch_applies_exactly",
       "tests/integration/test_slice_lanes.py::test_a_lane_retried_takes_its_failed_slice_again_then_the_rest",
       "tests/integration/test_slice_lanes.py::test_a_slice_taken_but_not_begun_stays_its_lanes"),
      "a lane takes a slice another lane took: two lanes harvest one slice"),
    M("I12-slice-resumes-only-what-is-staged", "store/slices.py",
      "    if counts[0] != row[3]:\n        return None\n", "    if False:\n        return None\n",
      (SLICES + "test_a_sierra_slice_whose_staging_was_lost_starts_over",),
      "a Sierra slice resumes from its checkpoint although a crash emptied its staging"),
    M("I2-iiif-slices-cut-between-instants", "iiif/slicing.py",
      "if (a := prefix_min[p]) is None or (b := suffix_max[p + 1]) is None or a > b]", "if True]",
      (IIIF_SLICES + "test_equal_end_times_across_pages_never_straddle_two_slices",),
      "an IIIF slice plan cuts between two activities of one instant: the apply orders them by chance"),
    M("I2-iiif-resumed-slice-keeps-its-decisions", "iiif/harvester.py",
      "processed = slices.staged_identifiers(sink.conn, sink.run)", "processed = set()",
      (IIIF_SLICES + "test_a_resumed_slice_keeps_the_newest_activity_it_staged_before_failing",),
      "a resumed IIIF slice forgets the objects its newer pages decided: an older activity wins a tie"),
    M("I12-slicing-sets-checked-against-the-whole-list", "oai/slicing.py",
      "    if sum(counts.values()) != total:\n", "    if False:\n",
      (SLICES + "test_sets_that_do_not_partition_the_list_are_not_trusted",),
      "the registry's slicing.sets are trusted without their counts: a set left out, or tombstones a repository "
      "lists outside their sets, are never harvested"),
    M("I12-slices-keep-the-windows-open-start", "oai/slicing.py",
      '        piece = Slice(from_=window.from_ if i == 0 else pieces[-1].until,',
      '        piece = Slice(from_=r.lo if i == 0 else pieces[-1].until,',
      ("tests/unit/test_slicing.py::test_similar_slices_cover_the_window_with_few_probes",
       "tests/unit/test_slicing.py::test_a_set_bigger_than_the_target_is_cut_in_time_within_its_set",
       SLICES + "test_sets_above_the_target_are_harvested_as_time_slices_of_each_set",
       SLICES + "test_a_wrong_earliest_datestamp_neither_loses_records_nor_stops_the_cut"),
      "the first slice (of the list, or of each set) starts at earliestDatestamp instead of the window's open "
      "start: records a repository stamps before the earliestDatestamp it announces are never harvested"),
    M("I13-a-plan-without-counts-still-slices", "oai/slicing.py",
      "            return pieces if len(pieces) >= 2 else []\n",
      "            return []\n",
      (SLICES + "test_a_repository_that_announces_no_list_size_is_cut_into_equal_time_ranges",),
      "a repository that announces no completeListSize (it is optional) is never sliced, whatever without_count "
      "says: its full harvest is one chain of hours"),
    M("I12-failed-check-alerts", "quality.py",
      "    for check in figures.failed_checks:\n", "    for check in ():\n",
      ("tests/unit/test_quality.py::test_a_failed_completeness_check_is_a_finding",),
      "a failed completeness check raises no data-quality alert"),
    # I13 -- the simulators vary where real servers do: the client must not assume one shape
    M("I13-export-ends-only-on-an-empty-block", "sierra/export.py",
      "        if covered == 0 and last_id is None:\n",
      "        if block.output_records < self.load.limit:\n",
      (SIERRA + "test_full_load_with_deleted_and_suppressed_bibs_in_every_block_holds_the_live_set",),
      "the export stops on a block with fewer records out than asked (deleted bibs inside it)"),
    # I14 -- fences: a write a lease or an operator's state protects checks, in its own transaction
    M("I14-writes-check-the-fence", "store/fences.py",
      "    if fence is not None:\n        check_fence(conn, fence, request)\n",
      "    if False:\n        check_fence(conn, fence, request)\n",
      (FENCES + "test_a_reconcile_frozen_past_its_lease_never_purges_what_the_next_harvest_applied",
       FENCES + "test_a_harvest_frozen_past_its_lease_stops_at_its_next_page",
       FENCE_DAG + "test_forget_while_a_run_waits_for_its_retry_is_not_undone_by_the_retry"),
      "no write checks its fence: a task frozen past its lease, or planned before forget, writes anyway"),
    Mutation("I14-lease-token-checked", "store/fences.py", (
        ("    if fence.lost.is_set():\n", "    if False:\n"),
        ('        "SELECT 1 FROM partner_leases WHERE partner_id = %s AND holder = %s AND token = %s FOR KEY SHARE",\n'
         '        (fence.partner_id, fence.holder, fence.token),\n',
         '        "SELECT 1 WHERE %s::text IS NOT NULL OR %s::text IS NOT NULL OR %s::bigint IS NOT NULL",\n'
         '        (fence.partner_id, fence.holder, fence.token),\n')),
      (FENCES + "test_a_reconcile_frozen_past_its_lease_never_purges_what_the_next_harvest_applied",),
      "the fence checks the epoch only: a reconcile resumed after its lease lapsed purges what the harvest applied"),
    M("I14-epoch-checked", "store/fences.py",
      "    if fence.epoch is not None and epoch != fence.epoch:\n", "    if False:\n",
      (FENCE_DAG + "test_forget_while_a_run_waits_for_its_retry_is_not_undone_by_the_retry",
       FENCES + "test_a_run_staged_before_an_operator_command_never_applies_after_it"),
      "the fence checks the lease only: a retry after forget applies into the emptied partner, sets the cursor"),
    M("I14-apply-fenced", "store/apply.py",
      '        fences.check(conn, f"apply of run {run_id}")\n', "        pass\n",
      (FENCES + "test_a_run_staged_before_an_operator_command_never_applies_after_it",),
      "the apply does not check its fence: a run staged before reset-cursor applies after it"),
    M("I14-cursor-move-fenced", "run.py",
      '    with fences.fenced(conn, f"cursor move of run {run_id}"):\n', "    with conn.transaction():\n",
      (FENCE_DAG + "test_reset_cursor_between_the_apply_and_the_cursor_move_is_not_overwritten",),
      "the cursor Variable is written unfenced: a run planned before reset-cursor --to overwrites it"),
    M("I14-forget-bumps-the-epoch", "store/admin.py",
      '        bump_epoch(conn, partner_id, "forget")\n', "",
      (FENCE_DAG + "test_forget_while_a_run_waits_for_its_retry_is_not_undone_by_the_retry",),
      "forget leaves the epoch: the retry of a run planned before it applies and sets the cursor again"),
    M("I14-keeper-tells-the-task", "store/leases.py",
      '                    self._lose(f"its tenure (token {self.fence.token}) is no longer held: it lapsed and was taken, or removed")\n',
      "                    continue\n",
      (FENCES + "test_a_keeper_that_cannot_renew_stops_the_work_at_its_next_page",),
      "a keeper that cannot renew says nothing: the task learns of it only from the database, if at all"),
    M("I14-a-lapsed-lease-is-a-new-tenure", "store/leases.py",
      '        conn.execute("DELETE FROM partner_leases WHERE partner_id = %s AND expires_at < now()", (partner_id,))\n',
      '        conn.execute("DELETE FROM partner_leases WHERE partner_id = %s AND false", (partner_id,))\n',
      (FENCES + "test_lease_tokens_only_grow_and_a_lapsed_tenure_gets_a_new_one",),
      "a lapsed lease is joined again with its old token: a task frozen in the old tenure could still write"),
    # The chain caps and slice boundaries
    M("cap-token-size", "oai/chain_caps.py",
      "        if size <= self.max_token_bytes:\n", "        if True:\n",
      (CAPS + "test_a_resumption_token_over_the_cap_fails_the_chain",),
      "a resumptionToken of any size is followed (a hostile partner grows the worker without bound)"),
    M("cap-chain-pages", "oai/chain_caps.py",
      "        if pages <= justified:\n", "        if True:\n",
      (CAPS + "test_a_chain_longer_than_its_complete_list_size_justifies_fails",),
      "a chain may run far past what its completeListSize justifies"),
    M("cap-run-bytes", "store/staging.py",
      "        if total > self.max_run_bytes:\n", "        if False:\n",
      (CAPS + "test_a_run_cannot_stage_more_than_its_cap",),
      "a run stages without limit"),
    M("I13-slices-overlap-at-the-boundary", "oai/slicing.py",
      '        piece = Slice(from_=window.from_ if i == 0 else pieces[-1].until,',
      '        piece = Slice(from_=window.from_ if i == 0 else pieces[-1].until + timedelta(seconds=1),',
      (BOUNDARIES + "test_records_stored_just_after_each_slice_boundary_are_harvested",),
      "adjacent slices [.., m] and [m + 1 s, ..]: a partner comparing sub-second stamps raw returns m + 0.5 s in neither"),
    # Not invariants of their own, but guards a broken build slipped past
    M("I11-mass-purge-inclusive", "reconcile.py",
      "plan.removals <= limit", "plan.removals < limit",
      (GUARDS + "test_mass_purge_limit_is_exactly_the_configured_fraction",),
      "the limit itself is refused"),
    M("I11-mass-purge-fraction", "reconcile.py",
      "    limit = partner.max_purge_fraction * plan.local\n", "    limit = 0.2 * plan.local\n",
      (GUARDS + "test_mass_purge_limit_is_exactly_the_configured_fraction",),
      "a fixed 20% instead of the partner's configured fraction"),
    M("loop-guard-repeated-token", "oai/client.py",
      "        if digest in self.seen_tokens:", "        if False:",
      (OAI + "test_repeated_token_is_a_loop_error_and_nothing_lands",),
      "a repeated resumptionToken loops forever: pytest-timeout must fail the test (takes ~2 min)"),
)


def _at_line_start(find: str) -> bool:
    """An indented ``find`` is matched only from the start of a line: as a substring it would
    also match a more deeply indented line, and the edit would land at the wrong depth."""
    return find.startswith(" ")


def _occurrences(text: str, find: str) -> int:
    return ("\n" + text).count("\n" + find) if _at_line_start(find) else text.count(find)


def _replaced(text: str, find: str, replace: str) -> str:
    if _at_line_start(find):
        return ("\n" + text).replace("\n" + find, "\n" + replace)[1:]
    return text.replace(find, replace)


def run(m: Mutation, pytest_args: list[str]) -> str:
    path = ROOT / LIB / m.file
    original = path.read_bytes()
    text = original.decode("utf-8")
    for find, replace in m.edits:
        if _occurrences(text, find) != 1:
            return "STALE"
        text = _replaced(text, find, replace)
    try:
        path.write_text(text, encoding="utf-8")
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-x", "--no-header", "-p", "no:randomly", *pytest_args, *m.tests],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
    finally:
        path.write_bytes(original)
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    print(f"    pytest exit {proc.returncode}: {lines[-1] if lines else ''}")
    for line in [line for line in lines if line.startswith("E ")][:2]:  # why it failed
        print(f"      {line[:150]}")
    # 1 = tests failed; 2..5 = interrupted, usage, no tests: not a catch.
    return "CAUGHT" if proc.returncode == 1 else "MISSED" if proc.returncode == 0 else f"ERROR({proc.returncode})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("ids", nargs="*", help="mutation ids or prefixes (default: all)")
    parser.add_argument("--list", action="store_true", help="list the mutations and exit")
    parser.add_argument("--pytest-arg", action="append", default=[], help="extra argument for pytest")
    args = parser.parse_args(argv)
    chosen = [m for m in MUTATIONS if not args.ids or any(m.id.startswith(i) for i in args.ids)]
    if args.list:
        for m in chosen:
            print(f"{m.id:32} {LIB}{m.file}: {m.what}\n{'':32} tests: {', '.join(m.tests)}")
        return 0
    results = {}
    for m in chosen:
        print(f"{m.id}: {m.what} ({LIB}{m.file})", flush=True)
        results[m.id] = run(m, args.pytest_arg)
        print(f"    => {results[m.id]}", flush=True)
    print("\nsummary:")
    for key, value in results.items():
        print(f"  {value:10} {key}")
    return 0 if all(v == "CAUGHT" for v in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
