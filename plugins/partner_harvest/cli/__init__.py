"""``partner-harvest``: the operator's command line, installed with the package.

    partner-harvest validate                     check the registry; exit 1 listing every invalid entry
    partner-harvest check ID | --url URL --protocol P  probe a partner's endpoint before onboarding; exit 1 if not ready
    partner-harvest status [--partner ID]        one line per partner, from the aggregation database (one partner:
                                                 and one line per channel: cursor, counts, items/holdings held)
    partner-harvest progress ID [--run RUN]      the newest (or named) run's channels and slices: records, rate, time left
    partner-harvest sync-pools [--check]         create/update the Airflow pools partner_<id>
    partner-harvest reset-cursor ID [--to WHEN]  delete or set the partner's cursor Variables (asks first)
    partner-harvest forget ID                    drop a partner's rows, pool and Variables (asks first)
    partner-harvest rollback ID --to-before RUN    restore the records to before a run, cursors back, DAGs paused (asks first)
    partner-harvest migrate [--check]            apply the aggregation schema (for HARVEST_SCHEMA_MANAGED=external)
    partner-harvest onboard [--connections F]    pools, Connections, unpaused DAGs, first harvests (--dry-run)
    partner-harvest report ID [--format json|csv] a report for the partner's own staff: runs, quarantine, warnings, proofs
    partner-harvest shards --shards N|--touch DIR split the partner DAGs over N files; have them parsed again

The aggregation database is ``--database-url``, else ``$HARVEST_DATABASE_URL``, else the
Airflow Connection ``aggregation_db`` (the environment or a secrets backend). Variables,
pools, DAGs and DAG runs go through Airflow's stable REST API: ``$HARVEST_AIRFLOW_API_URL``
(else Airflow's ``[api] base_url``) with ``$HARVEST_AIRFLOW_API_TOKEN``, or
``$HARVEST_AIRFLOW_API_USER`` and ``$HARVEST_AIRFLOW_API_PASSWORD``.
"""

from __future__ import annotations

import argparse
import os
import sys
from datetime import datetime, timezone
from types import ModuleType
from typing import Any

import psycopg
from psycopg import sql

from partner_harvest import protocols
from partner_harvest.registry import PARTNERS_FILE_ENV, Partner, Registry, RegistryError, cursor_key, cursor_value, load_registry
from partner_harvest.store import connect
from partner_harvest.store.admin import _PARTNER_TABLES, FEED_DELETIONS, forget_partner, unfinished_runs
from partner_harvest.store.db import scalar
from partner_harvest.store.fences import bump_epoch
from partner_harvest.store.runs import last_applied_until
from partner_harvest.store.schema import apply_migrations, migration_files, pending_migrations
from partner_harvest.window import SECONDS, WindowError, floor_to, format_instant, parse_instant

DATABASE_URL_ENV = "HARVEST_DATABASE_URL"
CURSOR_CHANNELS: dict[str, str | None] = {"changes": None, **{name: name for name in protocols.channels()}}


class CliError(Exception):
    """A command cannot do what was asked; the message says why (exit status 1)."""


# -- plumbing ---------------------------------------------------------------------------

def _registry(args: argparse.Namespace) -> Registry:
    try:
        return load_registry(args.registry)
    except RegistryError as exc:
        raise CliError(f"registry unusable: {exc}") from None


def _registry_naming_invalid(args: argparse.Namespace, consequence: str) -> tuple[Registry, int]:
    """The registry, with each invalid entry printed and what that means for it; status 1 if any."""
    registry = _registry(args)
    for error in registry.errors:
        print(f"invalid registry entry ({consequence}): {error}", file=sys.stderr)
    return registry, 1 if registry.errors else 0


def _airflow(purpose: str) -> ModuleType:
    """The Airflow side (Variables, pools, DAG runs through the REST API; Connections)."""
    try:
        from partner_harvest.airflow import admin
    except ImportError as exc:
        raise CliError(f"{purpose} needs Airflow and apache-airflow-client in this environment ({exc})") from None
    return admin


def _conninfo(args: argparse.Namespace) -> str:
    if args.database_url:
        return args.database_url
    if os.environ.get(DATABASE_URL_ENV):
        return os.environ[DATABASE_URL_ENV]
    admin = _airflow(f"reading the Connection aggregation_db (or pass --database-url / set {DATABASE_URL_ENV})")
    try:
        return admin.aggregation_conninfo()
    except Exception as exc:  # AirflowNotFoundException, a secrets backend error, ...
        raise CliError(f"no aggregation database: --database-url and {DATABASE_URL_ENV} are unset and the "
                       f"Airflow Connection aggregation_db cannot be read ({type(exc).__name__}: {exc})") from None


def _connect(args: argparse.Namespace) -> psycopg.Connection:
    try:
        return connect(_conninfo(args))
    except psycopg.Error as exc:
        raise CliError(f"cannot connect to the aggregation database: {exc}") from None


def _confirm(args: argparse.Namespace, partner_id: str) -> bool:
    """``--yes``, or the partner id typed back (stdin; a closed stdin declines)."""
    if args.yes:
        return True
    print(f"Type the partner id ({partner_id}) to go ahead, anything else to stop: ", end="", flush=True)
    answer = sys.stdin.readline().strip()
    if answer != partner_id:
        print("stopped: nothing changed")
        return False
    return True


def _active_leases(conn: psycopg.Connection, partner_id: str) -> list[tuple[str, str, datetime]]:
    rows = conn.execute(
        "SELECT holder, kind, expires_at FROM partner_leases WHERE partner_id = %s AND expires_at > now()"
        " ORDER BY holder",
        (partner_id,),
    ).fetchall()
    conn.commit()
    return rows


def _refuse_when_busy(conn: psycopg.Connection, partner_id: str) -> None:
    leases = _active_leases(conn, partner_id)
    if leases:
        holders = ", ".join(f"{holder} ({kind}, until {format_instant(expires)})" for holder, kind, expires in leases)
        raise CliError(f"partner {partner_id} is busy: {holders} holds its lease. Pause its DAGs and let the "
                       "run finish (a killed task's lease expires by itself), then try again")


def _runs_to_fence(conn: psycopg.Connection, admin: ModuleType | None, partner_id: str) -> tuple[list, list]:
    """Before the command: the partner's unfinished runs in the aggregation's audit and,
    with Airflow, its queued or running DAG runs (waiting for a retry, a reschedule or a
    pool slot hold no lease, so only the fence stops them)."""
    audit = unfinished_runs(conn, partner_id)
    conn.commit()
    dag_runs = admin.unfinished_dag_runs([f"harvest_{partner_id}", f"reconcile_{partner_id}"]) if admin else []
    return audit, dag_runs


def _report_fenced(command: str, epoch: int, audit: list, dag_runs: list) -> None:
    """What the command did to runs in flight, waiting or queued."""
    print(f"epoch of the partner: {epoch} (set by {command}); runs planned before it can neither apply nor move "
          "a cursor: each fails at its next write, naming this command")
    listed = set()
    for run in dag_runs:
        key = f"{run['dag_id']}/{run['run_id']}"
        listed.add(key)
        tasks = ", ".join(run["tasks"]) or "no task started"
        if run["dag_id"].startswith("reconcile_"):
            effect = "its reconcile plans from the new state when its task (re)starts"
        elif run["frozen"]:
            effect = "planned before: fenced (it will fail without applying or moving the cursor)"
        else:
            effect = "not planned yet: it plans from the new state"
        print(f"  DAG run {key} ({run['state']}; {tasks}): {effect}")
    for run_id, channels in audit:
        if run_id not in listed:
            print(f"  run {run_id} ({channels}): planned before: fenced")
    if not dag_runs and not audit:
        print("  no run of the partner was in flight, waiting or queued")


def _partner(registry: Registry, partner_id: str) -> Partner:
    for partner in registry.partners:
        if partner.id == partner_id:
            return partner
    error = registry.error_for(partner_id)
    if error is not None:
        raise CliError(f"partner {partner_id}'s registry entry is invalid: {error}")
    raise CliError(f"no partner {partner_id!r} in {registry.path}")


def _cursor_text(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, dict):
        return str(value.get("until") or value)
    return str(value)


# -- commands ---------------------------------------------------------------------------

def cmd_validate(args: argparse.Namespace) -> int:
    registry = _registry(args)
    for p in registry.partners:
        print(f"ok       {p.id} ({p.protocol}; DAGs {p.dag_id}, {p.reconcile_dag_id}; pool {p.pool})")
    for error in registry.errors:
        print(f"INVALID  {error}")
    if registry.errors:
        print(f"{len(registry.errors)} invalid entr{'y' if len(registry.errors) == 1 else 'ies'} in "
              f"{registry.path}: those partners get error DAGs and are not harvested", file=sys.stderr)
        return 1
    print(f"{registry.path}: {len(registry.partners)} partner(s), all valid")
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    from partner_harvest.cli import check

    partner = endpoint = None
    if args.partner:
        partner = _partner(_registry(args), args.partner)
        if not args.url:
            admin = _airflow("check (reading the partner's Connection; --url and the credential options skip it)")
            try:
                endpoint = admin.partner_endpoint(partner.conn_id)
            except Exception as exc:  # not in the environment nor a secrets backend, a bad extra, ...
                raise CliError(f"cannot read the Connection {partner.conn_id!r} of partner {partner.id} from the "
                               f"environment or a secrets backend ({type(exc).__name__}: {one_line(exc, 160)}); the "
                               "REST API never returns a password: run where the workers' secrets are, or give --url "
                               "with --login, --password-env and --auth") from None
    try:
        return check.run(args, partner, endpoint)
    except check.CheckError as exc:
        raise CliError(str(exc)) from None


def cmd_status(args: argparse.Namespace) -> int:
    from partner_harvest.cli.status import partner_overview, render_table, scheduler_runs
    from partner_harvest.store.content import notes as content_notes

    registry = _registry(args)
    partners = [_partner(registry, args.partner)] if args.partner else registry.partners
    errors = [e for e in registry.errors if not args.partner or e.partner == args.partner]
    scheduled, unread = scheduler_runs(partners)
    with _connect(args) as conn:
        rows, causes = partner_overview(conn, partners, datetime.now(timezone.utc), scheduled, errors)
        trust = content_notes(conn, [p.id for p in partners])
    print(render_table(rows))
    for partner_id, state, cause in causes:
        print(f"{partner_id} {state}: {cause}")
    for partner_id, note in trust:
        print(f"{partner_id}: {note}")
    if args.partner and protocols.channels_for(partners[0]):  # one partner: each channel on its own line
        from partner_harvest.store.health import channel_rows

        with _connect(args) as conn:
            print()
            print(render_table(channel_rows(conn, partners[0])))
    if unread:
        print(f"(Airflow's metadata database not read: {unread})")
    return 0


def cmd_progress(args: argparse.Namespace) -> int:
    from partner_harvest.cli.status import render_table
    from partner_harvest.store.progress import current_progress, summary_line

    registry = _registry(args)
    known = any(p.id == args.partner for p in registry.partners) or registry.error_for(args.partner) is not None
    if not known:
        raise CliError(f"partner {args.partner!r} is not in the registry {registry.path} "
                       f"(`partner-harvest validate` lists its partners)")
    with _connect(args) as conn:
        progress = current_progress(conn, args.partner, args.run)
    if progress is None:
        raise CliError(f"partner {args.partner} has no run {args.run!r}" if args.run
                       else f"partner {args.partner} has no run in the aggregation database yet")
    from partner_harvest.durations import ago

    print(render_table([{**c, "last_page": ago(c["last_page"]) if c["last_page"] is not None else None}
                        for c in progress.channels]))
    print(summary_line(progress))
    return 0


def cmd_sync_pools(args: argparse.Namespace) -> int:
    _airflow("sync-pools")
    from partner_harvest.airflow import pools

    registry, status = _registry_naming_invalid(args, "no pool, no DAG")
    if args.check:
        missing = pools.missing_pools(registry)
        for pool, partner_id in missing:
            print(f"pool {pool} is missing: the tasks of partner {partner_id} will never be scheduled", file=sys.stderr)
        if not missing:
            print(f"all {len(registry.partners)} partner pool(s) exist")
        return 1 if missing else status
    for name, slots, _ in pools.sync_pools(registry):
        print(f"pool {name}: {slots} slot(s)")
    return status


def cmd_reset_cursor(args: argparse.Namespace) -> int:
    partner = _partner(_registry(args), args.partner)
    own = protocols.channels_for(partner)
    channels: list[str | None] = [None, *(channel.name for channel in own)]
    if args.channel != "all":
        if CURSOR_CHANNELS[args.channel] not in channels:
            raise CliError(f"partner {partner.id} ({partner.protocol}) has no {args.channel} cursor")
        channels = [CURSOR_CHANNELS[args.channel]]
    try:
        target = parse_instant(args.to) if args.to else None
    except WindowError as exc:
        raise CliError(f"--to: {exc}") from None
    admin = _airflow("reset-cursor")
    with _connect(args) as conn:
        return _reset_cursor(args, partner, channels, target, admin, conn)


def _reset_cursor(args: argparse.Namespace, partner: Partner, channels: list[str | None], target: datetime | None,
                  admin: ModuleType, conn: psycopg.Connection) -> int:
    _refuse_when_busy(conn, partner.id)
    applied = {channel: last_applied_until(conn, partner.id, channel or "changes") for channel in channels}
    conn.commit()
    plan = []
    for channel in channels:
        key = cursor_key(partner.id, channel)
        current = admin.read_variable(key)
        granularity = current.get("granularity") if isinstance(current, dict) else None
        granularity = granularity or (protocols.channels()[channel].granularity if channel else SECONDS)
        new = floor_to(target, granularity) if target else None
        plan.append((key, current, new, granularity))
        after = f"{format_instant(new)}" if new else "deleted (the next incremental run harvests everything)"
        print(f"{key}: {_cursor_text(current)} -> {after}")
        newest = applied[channel]
        if new is not None and (newest is None or new > newest):
            print(f"  note: the aggregation database's newest applied incremental window ends "
                  f"{format_instant(newest) if newest else 'nowhere'}; the next run starts from there "
                  "(a cursor is never trusted beyond what the database holds)")
    if not _confirm(args, partner.id):
        return 1
    audit, dag_runs = _runs_to_fence(conn, admin, partner.id)
    # The Variables are written while the bumped epoch row is locked: a run's cursor move
    # (fenced, store/fences.py) either finished before, or fails after, never lands between.
    with conn.transaction():
        epoch = bump_epoch(conn, partner.id, "reset-cursor")
        for key, _, new, granularity in plan:
            if new is None:
                admin.delete_variable(key)
                if admin.defined_outside_the_metastore(key):
                    print(f"{key} is still defined outside the metadata database (AIRFLOW_VAR_* or a secrets "
                          "backend): remove it there", file=sys.stderr)
                    return 1
            else:
                admin.write_variable(key, cursor_value(new, granularity, "partner-harvest reset-cursor"),
                                     description=f"harvest cursor of partner {partner.id}")
            print(f"{key}: done")
    _report_fenced("reset-cursor", epoch, audit, dag_runs)
    return 0


def _row_counts(conn: psycopg.Connection, partner_id: str) -> dict[str, int]:
    counts = {}
    for table in _PARTNER_TABLES:
        statement = sql.SQL("SELECT count(*) FROM {} WHERE partner_id = %s").format(sql.Identifier(table))
        counts[table] = scalar(conn.execute(statement, (partner_id,)))
    conn.commit()
    return counts


def cmd_forget(args: argparse.Namespace) -> int:
    partner_id = args.partner
    try:
        keys = [cursor_key(partner_id), *(cursor_key(partner_id, channel) for channel in protocols.channels())]
    except ValueError as exc:
        raise CliError(str(exc)) from None
    registry = _registry(args)
    in_registry = any(p.id == partner_id for p in registry.partners) or registry.error_for(partner_id) is not None
    admin = None if args.database_only else _airflow("forget (Variables and pool; --database-only skips them)")
    pool = f"partner_{partner_id}"
    with _connect(args) as conn:
        _refuse_when_busy(conn, partner_id)
        counts = _row_counts(conn, partner_id)
        print(f"aggregation rows of {partner_id} to remove: " + ", ".join(f"{t} {n}" for t, n in counts.items()))
        print(f"each of its {counts['records']} record(s) is written to the change feed as a deletion first")
        variables = [key for key in keys if admin.read_variable(key) is not None] if admin else []
        drop_pool = admin is not None and not in_registry and admin.pool_exists(pool)
        if admin:
            print(f"Variables to delete: {', '.join(variables) or 'none'}")
            if in_registry:
                print(f"pool {pool}: kept ({partner_id} is still in {registry.path}; its next run harvests everything)")
            else:
                print(f"pool {pool}: {'to delete' if drop_pool else 'does not exist'}")
        if not _confirm(args, partner_id):
            return 1
        audit, dag_runs = _runs_to_fence(conn, admin, partner_id)
        removed = forget_partner(conn, partner_id)
        epoch = scalar(conn.execute("SELECT epoch FROM partner_fences WHERE partner_id = %s", (partner_id,)))
        conn.commit()
    written = removed.pop(FEED_DELETIONS)
    print(f"removed {sum(removed.values())} row(s): " + ", ".join(f"{t} {n}" for t, n in removed.items() if n))
    print(f"{FEED_DELETIONS}: {written} (reason 'forgotten'), so downstream consumers drop them too")
    for key in variables:
        if admin is not None:  # variables are listed only with Airflow at hand
            admin.delete_variable(key)
            print(f"Variable {key}: deleted")
    if drop_pool and admin is not None:
        admin.delete_pool(pool)
        print(f"pool {pool}: deleted")
    _report_fenced("forget", epoch, audit, dag_runs)
    return 0


def cmd_migrate(args: argparse.Namespace) -> int:
    with _connect(args) as conn:
        if args.check:
            pending = pending_migrations(conn)
            for name in pending:
                print(f"pending  {name}")
            if not pending:
                print(f"schema up to date ({len(migration_files())} migrations)")
            return 1 if pending else 0
        applied = apply_migrations(conn)
    for name in applied:
        print(f"applied  {name}")
    if not applied:
        print(f"schema up to date ({len(migration_files())} migrations)")
    return 0


def cmd_onboard(args: argparse.Namespace) -> int:
    _airflow("onboard")
    from pathlib import Path

    from partner_harvest.airflow.onboard import ConnectionFileError, onboard, read_connections_file

    registry, status = _registry_naming_invalid(args, "no pool, no DAG, not onboarded")
    try:
        connections = read_connections_file(Path(args.connections)) if args.connections else {}
    except ConnectionFileError as exc:
        raise CliError(str(exc)) from None
    ids = [p.id for p in registry.partners]
    with _connect(args) as conn:
        with_runs = {row[0] for row in conn.execute(
            "SELECT DISTINCT partner_id FROM harvest_runs WHERE partner_id = ANY(%s)", (ids,))}
        conn.commit()
    plan = onboard(registry.partners, connections, with_runs, dry_run=args.dry_run)
    for step in plan.steps:
        if step.changes or args.verbose or step.action in ("missing", "wait"):
            print(step.line(args.dry_run))
    counts: dict[str, int] = {}
    for step in plan.changes:
        counts[step.kind] = counts.get(step.kind, 0) + 1
    done = ", ".join(f"{n} {kind}" for kind, n in counts.items()) or "nothing to change"
    waiting = sum(1 for s in plan.steps if s.action == "wait")
    print(f"{len(registry.partners)} partner(s): {'would change' if args.dry_run and counts else ''}"
          f"{' ' if args.dry_run and counts else ''}{done}"
          f"{f'; {waiting} waiting (see above)' if waiting else ''}{'; dry run: nothing written' if args.dry_run else ''}")
    for problem in plan.problems:
        print(problem, file=sys.stderr)
    return 1 if plan.problems else status


def cmd_report(args: argparse.Namespace) -> int:
    from partner_harvest.airflow.api import URL_ENV as API_URL_ENV
    from partner_harvest.cli.airflow_side import configured
    from partner_harvest.report import build_report, report_csv

    partner = _partner(_registry(args), args.partner)
    endpoint = args.endpoint
    if endpoint is None and (configured() or os.environ.get(API_URL_ENV)):  # the partner's endpoint, from its Connection
        endpoint = _airflow("report (reading the partner's Connection; --endpoint skips it)").connection_base_url(
            partner.conn_id)
    with _connect(args) as conn:
        report = build_report(conn, partner, datetime.now(timezone.utc), endpoint=endpoint, days=args.days)
    if args.format == "csv":
        text = report_csv(report)
    else:
        import json

        text = json.dumps(report, indent=2, ensure_ascii=False) + "\n"
    if args.output:
        with open(args.output, "w", encoding="utf-8", newline="") as out:
            out.write(text)
        print(f"report of {partner.id} ({args.format}, {args.days} days): {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def cmd_rollback(args: argparse.Namespace) -> int:
    """Restore the partner's records to before a run (undoing it and every later run), its
    cursors to where they were, its DAGs paused; fenced and recorded (docs/operator/rollback.md)."""
    import getpass

    from partner_harvest import rollback
    from partner_harvest.store.history import RollbackRefused, plan_rollback

    partner = _partner(_registry(args), args.partner)
    with _connect(args) as conn:
        try:
            plan = plan_rollback(conn, partner.id, args.to_before)
        except RollbackRefused as exc:
            raise CliError(exc.cause) from None
        for line in plan.describe():
            print(line)
        print(f"  DAGs paused: {', '.join(rollback.dag_ids(partner))} (unpause them when the partner has fixed its data)")
        if not _confirm(args, partner.id):
            return 1
        admin = _airflow("rollback")
        try:
            done = rollback.roll_back(conn, partner, args.to_before, admin, requested_by=getpass.getuser(),
                                      via="cli", expected=plan)
        except RollbackRefused as exc:
            raise CliError(exc.cause) from None
    for line in done.lines():
        print(line)
    return 0


def cmd_shards(args: argparse.Namespace) -> int:
    from pathlib import Path

    from partner_harvest.airflow.shards import touch_dag_files, write_shards

    folder = Path(args.dags_folder)
    if args.touch:
        print(f"{len(touch_dag_files(folder))} partner DAG files marked changed in {folder}")
        return 0
    if args.shards is None:
        raise CliError("give --shards N (1: no shards) or --touch")
    written = write_shards(folder, args.shards)
    print(f"{len(written)} shard files in {folder}"
          + ("; partner_harvest.py and partner_reconcile.py listed in .airflowignore" if written else ""))
    return 0


# -- parser -----------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    registry = argparse.ArgumentParser(add_help=False)
    registry.add_argument("--registry", metavar="PATH",
                          help=f"registry file (default ${PARTNERS_FILE_ENV}, else include/partners.yaml)")
    common = argparse.ArgumentParser(add_help=False, parents=[registry])
    common.add_argument("--database-url", metavar="URL",
                        help=f"aggregation database (default ${DATABASE_URL_ENV}, else the Connection aggregation_db)")
    confirm = argparse.ArgumentParser(add_help=False)
    confirm.add_argument("--yes", action="store_true", help="do not ask for confirmation")

    parser = argparse.ArgumentParser(prog="partner-harvest", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    p = sub.add_parser("validate", parents=[common], help="check the registry; exit 1 listing every invalid entry")
    p.set_defaults(func=cmd_validate)
    p = sub.add_parser("check", parents=[registry],
                       help="probe a partner's endpoint before onboarding (a registry entry, or a bare --url): what "
                            "the harvest relies on works, what will not, what to fix; a few paced requests; exit 1 "
                            "when something will not work")
    from partner_harvest.cli import check

    check.add_arguments(p)
    p.set_defaults(func=cmd_check)
    p = sub.add_parser("status", parents=[common], help="one line per partner: records, quarantine, last runs")
    p.add_argument("--partner", metavar="ID")
    p.set_defaults(func=cmd_status)
    p = sub.add_parser("progress", parents=[common],
                       help="a run's channels (its slices): records so far, records per second, time left")
    p.add_argument("partner", metavar="PARTNER")
    p.add_argument("--run", metavar="RUN_ID", help="harvest_runs.run_id (default: the partner's newest run)")
    p.set_defaults(func=cmd_progress)
    p = sub.add_parser("sync-pools", parents=[common], help="create/update the pool partner_<id> of every partner")
    p.add_argument("--check", action="store_true", help="only report missing pools (exit 1 if any)")
    p.set_defaults(func=cmd_sync_pools)
    p = sub.add_parser("reset-cursor", parents=[common, confirm],
                       help="delete the partner's cursor Variables (next run: full harvest) or set them --to a time")
    p.add_argument("partner", metavar="PARTNER")
    p.add_argument("--to", metavar="WHEN", help="YYYY-MM-DD or ISO 8601 time (UTC unless an offset is given)")
    p.add_argument("--channel", choices=["all", *CURSOR_CHANNELS], default="all",
                   help="which cursor (a protocol's extra channels have their own; default all)")
    p.set_defaults(func=cmd_reset_cursor)
    p = sub.add_parser("forget", parents=[common, confirm],
                       help="remove a partner's rows, its cursor Variables and (once out of the registry) its pool")
    p.add_argument("partner", metavar="PARTNER")
    p.add_argument("--database-only", action="store_true", help="leave Airflow's Variables and pool alone")
    p.set_defaults(func=cmd_forget)
    p = sub.add_parser("rollback", parents=[common, confirm],
                       help="restore the partner's records to before a run (undoing it and every later run), set its "
                            "cursors back, pause its DAGs")
    p.add_argument("partner", metavar="PARTNER")
    p.add_argument("--to-before", metavar="RUN_ID", required=True,
                   help="harvest_runs.run_id (<dag_id>/<Airflow run id>) of the first run to undo")
    p.set_defaults(func=cmd_rollback)
    p = sub.add_parser("migrate", parents=[common], help="apply pending schema migrations to the aggregation database")
    p.add_argument("--check", action="store_true", help="only list pending migrations (exit 1 if any)")
    p.set_defaults(func=cmd_migrate)
    p = sub.add_parser("onboard", parents=[common],
                       help="bring Airflow in line with the registry: pools, Connections (from a file or a secrets "
                            "backend), unpaused DAGs, first harvests; idempotent")
    p.add_argument("--connections", metavar="FILE",
                   help="JSON or YAML {conn_id: {conn_type, host, login, password, schema, port, extra}} (the "
                        "shape `airflow connections export` writes); without it, Connections are only checked")
    p.add_argument("--dry-run", action="store_true", help="say what would change; change nothing")
    p.add_argument("--verbose", action="store_true", help="also list what is already in line")
    p.set_defaults(func=cmd_onboard)
    p = sub.add_parser("report", parents=[common],
                       help="a report for the partner's own staff (JSON or CSV): its runs, quarantine and warnings "
                            "by reason with samples, its completeness proofs")
    p.add_argument("partner", metavar="PARTNER")
    p.add_argument("--format", choices=["json", "csv"], default="json")
    p.add_argument("--days", type=int, default=90, help="how far back (default 90 days)")
    p.add_argument("--endpoint", metavar="URL",
                   help="the partner's endpoint to name (default: its Connection's host, when Airflow is configured)")
    p.add_argument("--output", metavar="FILE", help="write to FILE instead of standard output")
    p.set_defaults(func=cmd_report)
    p = sub.add_parser("shards", help="split the partner DAGs over N DAG files (docs/operator/many-partners.md), or "
                                      "--touch them after a registry edit so the dag-processor parses them again")
    p.add_argument("dags_folder", metavar="DAGS_FOLDER")
    p.add_argument("--shards", type=int, metavar="N", help="how many files per DAG kind (1: no shards)")
    p.add_argument("--touch", action="store_true", help="mark every partner DAG file changed now")
    p.set_defaults(func=cmd_shards)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except CliError as exc:
        print(f"partner-harvest {args.command}: {exc}", file=sys.stderr)
        return 1
    except psycopg.errors.UndefinedTable as exc:
        print(f"partner-harvest {args.command}: the aggregation database has no partner harvest schema yet "
              f"({exc.diag.message_primary}): run `partner-harvest migrate`", file=sys.stderr)
        return 1
    except psycopg.Error as exc:
        print(f"partner-harvest {args.command}: aggregation database: {type(exc).__name__}: {one_line(exc)}",
              file=sys.stderr)
        return 1
    except Exception as exc:  # anything else: one line, never a traceback (PARTNER_HARVEST_DEBUG=1 shows it)
        if type(exc).__name__ == "AirflowApiError":  # partner_harvest.airflow.api: says what to do already
            print(f"partner-harvest {args.command}: {exc}", file=sys.stderr)
            return 1
        if os.environ.get("PARTNER_HARVEST_DEBUG"):
            raise
        print(f"partner-harvest {args.command}: {type(exc).__name__}: {one_line(exc)} ({_hint(exc)})",
              file=sys.stderr)
        return 1


def one_line(value: object, limit: int = 300) -> str:
    text = " ".join(str(value).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _hint(exc: Exception) -> str:
    """What to do about an error no command expected (most are the wrong Airflow environment)."""
    text = str(exc)
    if "no such table" in text or "OperationalError" in type(exc).__name__:
        from partner_harvest.cli.airflow_side import LOCAL_UI_HINT

        return f"Airflow's metadata database is not the one you mean: run where the Airflow CLI runs, or {LOCAL_UI_HINT}"
    return "PARTNER_HARVEST_DEBUG=1 shows the traceback"
