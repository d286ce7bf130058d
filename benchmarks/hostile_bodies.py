"""Benchmark: what a hostile partner's body costs the harvesting process.

The OAI-PMH simulator runs in its own process; for each case it is told (control API
``attack_next``) to answer the next ListRecords hostilely, and a fresh harvesting
process runs freeze + harvest of a full window with the default limits. Printed per
case: how the harvest ended, after how long, and the harvesting process's peak RSS
(VmHWM), next to an honest harvest of the same collection.

    .venv/bin/python benchmarks/hostile_bodies.py [--bomb-gib 4] [--max-rss-mib 300]

Exit status 1 if the gzip bomb is not stopped with the cap in its message, or if any
hostile case lifts the peak RSS over --max-rss-mib.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository first
from benchmarks import support  # noqa: E402

CASES = {  # name -> (attack_next body, per-partner http options of the harvest)
    "honest harvest (baseline)": (None, {}),
    "gzip bomb": ({"kind": "gzip_bomb"}, {}),
    "endless body": ({"kind": "endless_body"}, {}),
    "15M empty elements (60 MiB)": ({"kind": "wide_xml", "size": 15_000_000}, {}),
    "1M attributes": ({"kind": "many_attributes", "size": 1_000_000}, {}),
    "nesting 100,000 deep": ({"kind": "deep_xml", "size": 100_000}, {}),
    "slow drip, 1 byte/s": ({"kind": "slow_drip", "interval": 1.0}, {"request_deadline": 5}),
}


def child(args: argparse.Namespace) -> None:
    """The harvesting process: one full window; reports how it ended and its peak RSS."""
    from partner_harvest import pipeline
    from partner_harvest.factory import Endpoint, build_adapter
    from partner_harvest.store import RunRef, connect

    http = {"backoff_factor": 0.01, **json.loads(args.http)}
    partner = support.partner(id="hostile", protocol="oai-pmh", metadata_prefix="oai_dc", options={"http": http})
    adapter = build_adapter(partner, Endpoint(args.url))
    started = time.perf_counter()
    outcome: dict = {}
    with connect(args.db) as conn:
        try:
            window = pipeline.freeze_window(adapter, partner.lag, None, pipeline.RunRequest("full"))
            stats = pipeline.harvest_window(adapter, conn, RunRef("hostile", args.run_id), window)
            outcome = {"ok": True, "fetched": stats.fetched}
        except Exception as exc:  # the figure we want is how it failed
            outcome = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    print(json.dumps({**outcome, "seconds": time.perf_counter() - started, "peak_rss_mib": support.peak_rss_mib()}))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=2000)
    parser.add_argument("--page-size", type=int, default=500)
    parser.add_argument("--bomb-gib", type=float, default=4.0, help="decoded size of the gzip bomb")
    parser.add_argument("--max-rss-mib", type=float, default=300.0)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--url")
    parser.add_argument("--db")
    parser.add_argument("--run-id")
    parser.add_argument("--http", default="{}")
    args = parser.parse_args()
    if args.child:
        child(args)
        return 0

    from include.simulators.oai_pmh.server import _gzip_bomb
    from partner_harvest.transport import HttpPolicy

    bomb_bytes = int(args.bomb_gib * (1 << 30))
    compressed = len(_gzip_bomb(b"", bomb_bytes))
    policy = HttpPolicy()
    print(f"Hostile bodies: {args.records:,}-record collection, {args.page_size} per page; defaults "
          f"max_response_bytes {policy.max_response_bytes / (1 << 20):g} MiB, max_xml_nodes "
          f"{policy.max_xml_nodes:,}, request_deadline {policy.request_deadline:g} s; "
          f"gzip bomb {compressed / (1 << 20):.1f} MiB on the wire -> {bomb_bytes / (1 << 30):g} GiB decoded")
    db = support.fresh_database("hostile")
    ok = True
    sim_args = ("--records", str(args.records), "--page-size", str(args.page_size), "--formats", "oai_dc")
    with support.simulator("oai_pmh", *sim_args) as url:
        for number, (name, (attack, http)) in enumerate(CASES.items()):
            if attack is not None:
                body = {**attack, "verb": "ListRecords"}
                if attack["kind"] == "gzip_bomb":
                    body["size"] = bomb_bytes
                support.control(url, "attack_next", body)
            result = support.run_child(__file__, "--url", url, "--db", db, "--run-id", f"case-{number}",
                                       "--http", json.dumps(http))
            ended = f"fetched {result['fetched']:,} records" if result["ok"] else result["error"]
            print(f"\n{name}\n  {result['seconds']:.2f} s, peak RSS {result['peak_rss_mib']:.1f} MiB\n  {ended}")
            if attack is not None:
                ok = ok and not result["ok"] and result["peak_rss_mib"] < args.max_rss_mib
            if name == "gzip bomb":
                ok = ok and "max_response_bytes" in result.get("error", "")
    print(f"\nevery hostile case failed cleanly under {args.max_rss_mib:g} MiB: {'yes' if ok else 'NO'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
