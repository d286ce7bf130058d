"""Benchmark: one OAI-PMH token chain, ours end to end against the chain's floor and Sickle.

A token chain is sequential: page N+1 needs page N's token. Its floor is a bare fetch
loop (raw HTTP and a regular expression for the token, no XML parsing, nothing stored).
Ours fetches page N+1 while page N is validated and copied into staging (pipelining),
then applies the run into the aggregation tables; records/s below is end to end: freeze
(Identify), harvest into staging and apply, in real PostgreSQL.

(a) slow repository: every response waits --delay-ms (default 200 ms): the bare loop,
    ours pipelined (target >= 0.9x the floor) and ours sequential (the gain).
(b) no delay: the bare loop, Sickle iterating ListRecords (fetch only: its own parsing
    into Record objects, nothing stored), ours pipelined and sequential in one chain, and
    ours as a big partner's full harvest runs: --slices slices in parallel processes, then
    the apply (targets: ours >= 1.5x Sickle, >= 0.8x the bare loop). ``--repeat N`` measures
    Sickle and the sliced harvest N times in turn and judges the median of the pairs' ratios
    (the machine's speed drifts from minute to minute; one pair can mislead either way).

Sickle is never a project dependency. It is looked for in --sickle-dir (default
/tmp/ph-bench-sickle); `--install-sickle` puts it there first with
``pip install --target <dir> --no-deps sickle==0.7.0`` (it needs only requests and lxml,
which the project has). Without it, the Sickle line says "skipped" and why.

The simulator runs in its own process, each measurement in a fresh child process; the
machine's load average is printed with every figure (other work on the machine skews
them). All figures of one run come from the same simulator and the same run.

    .venv/bin/python benchmarks/oai_chain.py [--records 200000] [--page-size 500]
        [--delay-ms 200] [--parts a,b] [--repeat 1] [--install-sickle]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from xml.sax.saxutils import unescape

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository first
from collections.abc import Callable
from typing import Any

from benchmarks import support  # noqa: E402

PARTNER = "chain"
SICKLE_DIR = "/tmp/ph-bench-sickle"
SICKLE_PIN = "sickle==0.7.0"
_TOKEN = re.compile(rb"<resumptionToken[^>]*>([^<]+)</resumptionToken>")


# ---------------------------------------------------------------------- children


def bare(args: argparse.Namespace) -> dict:
    """The floor: one token chain, raw HTTP and token extraction only."""
    import requests

    session = requests.Session()
    session.headers["Accept-Encoding"] = "gzip, deflate"
    params = {"verb": "ListRecords", "metadataPrefix": args.prefix}
    records = pages = 0
    started = time.perf_counter()
    while True:
        response = session.get(args.url, params=params, timeout=60)
        response.raise_for_status()
        content = response.content
        pages += 1
        records += content.count(b"<record>")
        match = _TOKEN.search(content)
        if match is None:
            break
        params = {"verb": "ListRecords", "resumptionToken": unescape(match.group(1).decode())}
    return {"records": records, "pages": pages, "seconds": time.perf_counter() - started}


def sickle(args: argparse.Namespace) -> dict:
    """Sickle iterating ListRecords: fetch and its own parsing, nothing stored."""
    sys.path.insert(0, args.sickle_dir)
    from sickle import Sickle  # type: ignore[import-not-found]  # installed by --install-sickle only, never a dependency

    client = Sickle(args.url, max_retries=3, timeout=60)
    records = 0
    started = time.perf_counter()
    for _record in client.ListRecords(metadataPrefix=args.prefix, ignore_deleted=False):
        records += 1
    return {"records": records, "seconds": time.perf_counter() - started}


def _phase_meter() -> dict[str, float]:
    """CPU seconds of the client's three steps, each counted on the thread that ran it (a
    pipelined chain fetches on a thread of its own): fetch (HTTP and decoding), parse
    (lxml and every record's checks) and stage (COPY and the page's transaction)."""
    from partner_harvest.oai import client, parse
    from partner_harvest.store import staging

    spent = {"fetch": 0.0, "parse": 0.0, "stage": 0.0}

    def metered(owner: object, name: str, phase: str) -> None:
        inner = getattr(owner, name)

        def timed(*a: Any, **kw: Any) -> Any:
            started = time.thread_time()
            try:
                return inner(*a, **kw)
            finally:
                spent[phase] += time.thread_time() - started

        setattr(owner, name, timed)

    metered(client.OaiClient, "fetch", "fetch")
    metered(parse, "parse_list_page", "parse")
    metered(staging.StagingWriter, "write_page", "stage")
    return spent


def ours(args: argparse.Namespace) -> dict:
    """Ours end to end: freeze, harvest into staging (pipelined or not), apply."""
    from partner_harvest import pipeline
    from partner_harvest.factory import Endpoint, build_adapter
    from partner_harvest.oai.harvester import OaiAdapter
    from partner_harvest.run import run_partner
    from partner_harvest.store import connect

    phases = _phase_meter()

    partner = support.partner(id=args.partner, protocol="oai-pmh", metadata_prefix=args.prefix)
    adapter = build_adapter(partner, Endpoint(args.url))
    assert isinstance(adapter, OaiAdapter)
    if args.sequential:
        from benchmarks import baselines

        baselines.sequential(adapter.client)  # the chain one page at a time
    with connect(args.db) as conn:  # the DAG's steps (partner_harvest.run), each one timed
        run = run_partner(partner, adapter, conn, args.run_id, request=pipeline.RunRequest("full"))
    stats, result = run.changes, run.applied
    return {"records": stats.fetched, "pages": stats.pages, "upserted": result.upserted,
            "harvest_seconds": run.seconds["freeze"] + run.seconds["stage"], "seconds": sum(run.seconds.values()),
            "peak_rss_mib": support.peak_rss_mib(), "phases": phases}


CHILDREN = {"bare": bare, "sickle": sickle, "ours": ours}


# ------------------------------------------------------------------------ parent


def _load() -> str:
    one, five, _ = os.getloadavg()
    return f"load {one:.2f}/{five:.2f}"


def _run(kind: str, url: str, prefix: str, *extra: str) -> dict:
    load_before = _load()
    figures = support.run_child(__file__, "--kind", kind, "--url", url, "--prefix", prefix, *extra)
    figures["rate"] = figures["records"] / figures["seconds"]
    figures["load"] = f"{load_before} before, {_load()} after"
    return figures


def _ours(url: str, db: str, prefix: str, run_id: str, *, sequential: bool) -> dict:
    """A first full load under a partner id of its own, settled before the measurements
    (main: forgotten and vacuumed; the database keeps the other partners' rows)."""
    partner_id = _partner_id(run_id)
    extra = ("--db", db, "--run-id", run_id, "--partner", partner_id) + (("--sequential",) if sequential else ())
    figures = _run("ours", url, prefix, *extra)
    figures["exact"] = support.held_ids(db, partner_id) == support.control(url, "live_ids")
    return figures


def _partner_id(run_id: str) -> str:
    """A registry id of its own per load (lowercase words joined by single '_')."""
    return f"{PARTNER}_{run_id}".replace("-", "_")


def _sliced_partner(repetition: int) -> str:
    # its own: another benchmark may be using sliced_harvest's; each repetition a first load
    return f"{PARTNER}_sliced" + (f"_{repetition + 1}" if repetition else "")


def _ours_sliced(url: str, db: str, args: argparse.Namespace, repetition: int = 0) -> dict:
    """A full harvest the way a big partner's runs: planned into slices harvested by parallel
    processes (Airflow's mapped harvest_changes), then one apply (benchmarks/sliced_harvest.py)."""
    from benchmarks import sliced_harvest

    partner_id = _sliced_partner(repetition)
    plan = argparse.Namespace(records=args.records, slices=args.slices, partner=partner_id)
    load_before = _load()
    figures = sliced_harvest.run(sliced_harvest.__file__, url, db, plan, args.slices, "b-sliced")
    figures.update(records=figures["fetched"], seconds=figures["wall"], rate=figures["fetched"] / figures["wall"],
                   load=f"{load_before} before, {_load()} after")
    figures["exact"] = support.held_ids(db, partner_id) == support.control(url, "live_ids")
    return figures


def _line(label: str, f: dict) -> str:
    return (f"  {label:<34} {f['rate']:>9,.0f} records/s  ({f['records']:,} in {f['seconds']:.1f} s; {f['load']})")


def _ours_line(label: str, f: dict) -> str:
    per_page = ", ".join(f"{name} {1000 * cpu / f['pages']:.1f}" for name, cpu in f["phases"].items())
    return (_line(label, f) + f"\n  {'':<34} harvest {f['harvest_seconds']:.1f} s + apply "
            f"{f['seconds'] - f['harvest_seconds']:.1f} s; records == live set: {'yes' if f['exact'] else 'NO'}; "
            f"peak RSS {f['peak_rss_mib']:.0f} MiB"
            f"\n  {'':<34} client CPU per page (ms): {per_page}")


def _verdict(name: str, ratio: float, target: float) -> str:
    return f"  {name:<44} {ratio:5.2f}x  (target >= {target}x: {'met' if ratio >= target else 'NOT met'})"


def _sickle_available(directory: str) -> str | None:
    """None when Sickle can be imported from `directory`, else why not."""
    if not os.path.isdir(os.path.join(directory, "sickle")):
        return f"not installed in {directory} (run with --install-sickle)"
    return None


def part_a(url: str, db: str, args: argparse.Namespace) -> bool:
    support.control(url, "response_delay", {"ms": args.delay_ms})
    print(f"\n(a) {args.delay_ms:.0f} ms per response")
    floor = _run("bare", url, args.prefix)
    print(_line("bare fetch loop (the chain floor)", floor))
    piped = _ours(url, db, args.prefix, "a-pipelined", sequential=False)
    print(_ours_line("ours, pipelined, end to end", piped))
    seq = _ours(url, db, args.prefix, "a-sequential", sequential=True)
    print(_ours_line("ours, sequential, end to end", seq))
    ratio = piped["rate"] / floor["rate"]
    print(_verdict("ours pipelined / floor", ratio, 0.9))
    print(_staged_only("ours pipelined", piped, floor))
    print(f"  {'ours sequential / floor':<44} {seq['rate'] / floor['rate']:5.2f}x; "
          f"pipelining gains {piped['rate'] / seq['rate']:.2f}x")
    return ratio >= 0.9 and piped["exact"] and seq["exact"]


def _staged_only(label: str, ours: dict, floor: dict) -> str:
    """The harvest alone (freeze + staging, no apply) against the floor: where the time goes."""
    rate = ours["records"] / ours["harvest_seconds"]
    return f"  {label + ', staged only (no apply) / floor':<50} {rate / floor['rate']:5.2f}x  ({rate:,.0f} records/s)"


def _metered(meter: support.CpuMeter, measure: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    meter.start()
    figures = measure()
    figures["cpu"] = meter.stop()
    return figures


def _cpu_line(label: str, f: dict) -> str:
    c = f["cpu"]
    return (f"    {label:<30} client {c['client']:5.1f} + PostgreSQL {c['postgres']:5.1f} + simulator "
            f"{c['simulator']:4.1f} = {c['total']:5.1f} CPU-s in {f['seconds']:5.1f} s")


def _cpu_budget(floor: dict, sick: dict | None, piped: dict, sliced: dict, slices: int) -> None:
    """Why a target is out of reach: the least wall time the CPU a run used allows, against
    the wall time the target allows. The apply is one PostgreSQL transaction, so while it
    runs one core works; everything else could at best share all cores evenly."""
    cores = os.cpu_count() or 1
    print(f"  CPU used while measuring (client processes with their start-up, PostgreSQL with its background "
          f"work, simulator; {cores} cores):")
    if sick is not None:
        print(_cpu_line("Sickle fetch-only", sick))
    print(_cpu_line("ours pipelined, one chain", piped))
    print(_cpu_line(f"ours, {slices} slices", sliced))
    apply = sliced["apply_seconds"]
    least = apply + max(0.0, sliced["cpu"]["total"] - apply) / cores
    print(f"  ours with {slices} slices cannot take less than {least:.1f} s on {cores} cores: the apply's "
          f"{apply:.1f} s on one core, plus the other {sliced['cpu']['total'] - apply:.1f} CPU-s spread over "
          f"{cores} cores with nothing else running")
    targets = [("0.8x the bare loop", sliced["records"] / (0.8 * floor["rate"]))]
    if sick is not None:
        targets.insert(0, ("1.5x Sickle", sliced["records"] / (1.5 * sick["rate"])))
    for name, allowed in targets:
        print(f"    {name} allows {allowed:.1f} s for these records: "
              f"{'within reach' if least <= allowed else 'out of reach by this CPU alone'}")


def part_b(url: str, db: str, args: argparse.Namespace) -> bool:
    support.control(url, "response_delay", {"ms": 0})
    print("\n(b) no delay")
    meter = support.CpuMeter(args.simulator_pid)
    floor = _run("bare", url, args.prefix)
    print(_line("bare fetch loop", floor))
    missing = _sickle_available(args.sickle_dir)
    sick = None
    if missing:
        print(f"  {'Sickle 0.7.0, fetch only':<34} skipped: {missing}")
    else:
        sick = _metered(meter, lambda: _run("sickle", url, args.prefix, "--sickle-dir", args.sickle_dir))
        print(_line("Sickle 0.7.0, fetch only", sick))
    piped = _metered(meter, lambda: _ours(url, db, args.prefix, "b-pipelined", sequential=False))
    print(_ours_line("ours, pipelined, end to end", piped))
    seq = _ours(url, db, args.prefix, "b-sequential", sequential=True)
    print(_ours_line("ours, sequential, end to end", seq))
    sliced = _metered(meter, lambda: _ours_sliced(url, db, args))
    print(_line(f"ours, {args.slices} slices, end to end", sliced) +
          f"\n  {'':<34} apply {sliced['apply_seconds']:.1f} s; records == live set: {'yes' if sliced['exact'] else 'NO'}")
    ok = piped["exact"] and seq["exact"] and sliced["exact"]
    ratios = [sliced["rate"] / sick["rate"]] if sick is not None else []
    for repetition in range(1, args.repeat if sick is not None else 1):  # in turn: a pair shares the machine's state
        again_sick = _run("sickle", url, args.prefix, "--sickle-dir", args.sickle_dir)
        again = _ours_sliced(url, db, args, repetition)
        ok = ok and again["exact"]
        ratios.append(again["rate"] / again_sick["rate"])
        print(f"  pair {repetition + 1}: Sickle {again_sick['rate']:,.0f}/s, ours {args.slices} slices "
              f"{again['rate']:,.0f}/s (apply {again['apply_seconds']:.1f} s; exact: {'yes' if again['exact'] else 'NO'}): "
              f"{ratios[-1]:.2f}x ({again_sick['load']})")
    if sick is not None:
        print(_verdict("ours pipelined, one chain / Sickle fetch-only", piped["rate"] / sick["rate"], 1.5))
        ratio = statistics.median(ratios)
        label = f"ours, {args.slices} slices / Sickle fetch-only" + (f" (median of {len(ratios)})" if len(ratios) > 1 else "")
        print(_verdict(label, ratio, 1.5) + (f"; pairs {', '.join(f'{r:.2f}x' for r in ratios)}" if len(ratios) > 1 else ""))
        ok = ok and ratio >= 1.5
    print(_verdict(f"ours, {args.slices} slices / bare fetch loop", sliced["rate"] / floor["rate"], 0.8))
    ratio = piped["rate"] / floor["rate"]
    print(_verdict("ours pipelined / bare fetch loop", ratio, 0.8))
    print(_staged_only("ours pipelined", piped, floor))
    print(f"  {'ours sequential / bare fetch loop':<44} {seq['rate'] / floor['rate']:5.2f}x; "
          f"pipelining gains {piped['rate'] / seq['rate']:.2f}x")
    _cpu_budget(floor, sick, piped, sliced, args.slices)
    return ok and ratio >= 0.8


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--page-size", type=int, default=500)
    parser.add_argument("--delay-ms", type=float, default=200.0)
    parser.add_argument("--parts", default="a,b")
    parser.add_argument("--prefix", default="oai_dc")
    parser.add_argument("--slices", type=int, default=4, help="(b): the sliced full harvest's slices")
    parser.add_argument("--repeat", type=int, default=1,
                        help="(b): measure Sickle and the sliced harvest this many times, in turn; the verdict "
                             "takes the median of the pairs' ratios (the machine's speed drifts)")
    parser.add_argument("--sickle-dir", default=SICKLE_DIR)
    parser.add_argument("--install-sickle", action="store_true")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--kind", choices=sorted(CHILDREN), help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--db", help=argparse.SUPPRESS)
    parser.add_argument("--run-id", help=argparse.SUPPRESS)
    parser.add_argument("--partner", default=PARTNER, help=argparse.SUPPRESS)
    parser.add_argument("--sequential", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        import json

        print(json.dumps(CHILDREN[args.kind](args)))
        return 0
    if args.install_sickle:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--target", args.sickle_dir,
                        "--no-deps", SICKLE_PIN], check=True)
    parts = {p.strip() for p in args.parts.split(",")}
    print(f"One OAI-PMH token chain: {args.records:,} records, {args.page_size} per page, prefix {args.prefix}, "
          f"5% deleted; simulator, harvester and PostgreSQL in separate processes on {os.cpu_count()} cores; "
          f"{_load()} at start")
    db = support.fresh_database(PARTNER)
    loads = [_partner_id(f"{part}-{how}") for part in "ab" for how in ("pipelined", "sequential")]
    loads += [_sliced_partner(i) for i in range(args.repeat)]
    print(f"  (settled: the partners forgotten and the tables vacuumed in {support.settle(db, loads):.1f} s)")
    sim_args = ("--records", str(args.records), "--deleted-fraction", "0.05", "--page-size", str(args.page_size),
                "--granularity", "seconds", "--formats", "oai_dc,lido")
    ok = True
    with support.simulator("oai_pmh", *sim_args) as url:
        args.simulator_pid = support.child_pid("include.simulators.oai_pmh")
        if "a" in parts:
            ok = part_a(url, db, args) and ok
        if "b" in parts:
            ok = part_b(url, db, args) and ok
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
