"""``partner-harvest check``: a partner's endpoint probed before onboarding (readiness.py).

The partner is a registry entry (its Connection read from the environment or a secrets
backend, as the workers read it), or a bare URL with ``--protocol`` (and registry keys in
``--entry``). The secret of a bare URL comes from an environment variable, never from the
command line (which other users of the machine can read).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import yaml

from partner_harvest import protocols
from partner_harvest.credentials import KINDS
from partner_harvest.factory import Endpoint
from partner_harvest.readiness import CheckSettings, run_check
from partner_harvest.registry import Partner, parse_registry

BARE_ID = "checked"  # the id of a bare URL's partner (no registry entry)


class CheckError(Exception):
    """The command cannot run the check as asked; the message says why."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("partner", metavar="PARTNER", nargs="?",
                        help="a registry entry (its settings and Connection); or give --url and --protocol")
    parser.add_argument("--url", metavar="URL",
                        help="the endpoint (OAI-PMH base URL, Sierra API base URL, IIIF stream URL); with PARTNER: "
                             "instead of its Connection's, the credentials from the options below")
    parser.add_argument("--protocol", choices=protocols.names(), help="the protocol of a bare --url")
    parser.add_argument("--entry", metavar="YAML",
                        help="registry keys of a bare --url, as a YAML mapping, e.g. "
                             "'{sets: [maps], options: {oai: {method: identifiers_then_get}}}'")
    parser.add_argument("--login", metavar="LOGIN", help="with --url: the Connection's login")
    parser.add_argument("--password-env", metavar="VAR",
                        help="with --url: the environment variable holding the Connection's password (the secret)")
    parser.add_argument("--auth", choices=KINDS, help="with --url: how the secret travels (the Connection's extra auth)")
    parser.add_argument("--auth-name", metavar="NAME",
                        help="with --auth header or query: the header's or the parameter's name")
    parser.add_argument("--delay", type=float, default=1.0, metavar="SECONDS",
                        help="seconds between two requests (at least the partner's request_delay)")
    parser.add_argument("--pause", type=float, default=30.0, metavar="SECONDS",
                        help="how long a resumption token waits before it is used again")
    parser.add_argument("--max-requests", type=int, default=40, metavar="N",
                        help="the most requests the check sends, retries included")
    parser.add_argument("--format", choices=["text", "json"], default="text")
    parser.add_argument("--verbose", action="store_true",
                        help="also print the harvester's own warnings on standard error (the report names the causes)")


def run(args: argparse.Namespace, registry_partner: Partner | None, airflow_endpoint: Endpoint | None) -> int:
    """The check of ``registry_partner`` (with its Connection's ``airflow_endpoint``, unless
    --url) or of a bare --url; prints the report, returns its exit status."""
    if args.delay < 0 or args.pause < 0 or args.max_requests < 1:
        raise CheckError("--delay and --pause must be >= 0, --max-requests >= 1")
    subject = None
    if registry_partner is not None:
        partner = registry_partner
        if args.protocol and args.protocol != partner.protocol:
            raise CheckError(f"partner {partner.id} is {partner.protocol}, not {args.protocol}")
        if args.entry:
            raise CheckError("--entry is for a bare --url; a registry partner's keys are its entry's")
        endpoint = _flags_endpoint(args) if args.url else airflow_endpoint
        assert endpoint is not None
    else:
        if not args.url or not args.protocol:
            raise CheckError("give a registry PARTNER, or --url and --protocol")
        partner = _bare_partner(args)
        endpoint = _flags_endpoint(args)
        subject = f"{args.url} as {protocols.spec_of(args.protocol).title}"
    settings = CheckSettings(delay=args.delay, pause=args.pause, max_requests=args.max_requests)
    with _quiet(not args.verbose):
        report = run_check(partner, endpoint, settings, subject=subject)
    if args.format == "json":
        sys.stdout.write(json.dumps(report.to_json(), indent=2, ensure_ascii=False) + "\n")
    else:
        sys.stdout.write(report.text())
    return report.exit_status


@contextmanager
def _quiet(quiet: bool) -> Iterator[None]:
    """The harvester's log lines off while the check runs: they would repeat the report's causes."""
    logger = logging.getLogger("partner_harvest")
    level = logger.level
    if quiet:
        logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


def _bare_partner(args: argparse.Namespace) -> Partner:
    try:
        keys = yaml.safe_load(args.entry) if args.entry else {}
    except yaml.YAMLError as exc:
        raise CheckError(f"--entry is not YAML: {' '.join(str(exc).split())}") from None
    if not isinstance(keys, dict):
        raise CheckError("--entry must be a YAML mapping of registry keys")
    fixed = {"id": BARE_ID, "protocol": args.protocol, "conn_id": BARE_ID}
    clash = sorted(set(keys) & set(fixed))
    if clash:
        raise CheckError(f"--entry cannot set {', '.join(clash)}")
    checked = parse_registry({"partners": [{**fixed, **keys}]}, "--entry")  # read as the registry reads an entry
    if checked.errors:
        raise CheckError(str(checked.errors[0]))
    return checked.partners[0]


def _flags_endpoint(args: argparse.Namespace) -> Endpoint:
    password = None
    if args.password_env:
        password = os.environ.get(args.password_env)
        if not password:
            raise CheckError(f"--password-env {args.password_env}: that environment variable is unset or empty")
    extra: dict[str, str] = {}
    if args.auth:
        extra["auth"] = args.auth
        if args.auth in ("header", "query"):
            if not args.auth_name:
                raise CheckError(f"--auth {args.auth} needs --auth-name (the name the endpoint expects)")
            extra["auth_header" if args.auth == "header" else "auth_param"] = args.auth_name
    return Endpoint(args.url, login=args.login, password=password, extra=extra)
