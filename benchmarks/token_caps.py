"""Benchmark: what a partner's 8 MB resumptionTokens cost a harvest.

A hostile (or careless) repository hands out a distinct 8 MB token on every page. Before the
caps the loop guard kept every token it saw, and nothing capped a token's size: 40
pages grew a worker by over a gigabyte. Now a token over ``options.limits.max_token_bytes``
(default 64 KiB) fails its chain at the first such page, and the guard keeps a 32-byte
digest of each token instead of the token.

Part 1, harvests: a fresh harvesting process runs freeze + harvest of a full window of a
4,000-record collection (40 pages) served by the OAI simulator (in this process), first
with its own short tokens (the baseline), then with 8 MB tokens; printed: how each ended
and the process's peak RSS (VmHWM), and the difference.

Part 2, the loop guard alone: 40 distinct 8 MB tokens through the guard as it was (a set
of tokens) and as it is (a set of digests, oai/client._Chain); printed: the memory each
keeps (tracemalloc), and the ratio.

    .venv/bin/python benchmarks/token_caps.py [--token-mib 8] [--pages 40]

Exit status 1 if the 8 MB harvest does not fail naming max_token_bytes, or its peak RSS
passes the baseline's by more than --max-extra-mib (default 64).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository first
from collections.abc import Iterator

from benchmarks import support  # noqa: E402


def child(args: argparse.Namespace) -> None:
    """The harvesting process: one full window with the default limits."""
    from partner_harvest import pipeline
    from partner_harvest.factory import Endpoint, build_adapter
    from partner_harvest.store import RunRef, connect

    partner = support.partner(id="tokens", protocol="oai-pmh", metadata_prefix="oai_dc",
                              options={"http": {"backoff_factor": 0.01, "retries": 0}})
    adapter = build_adapter(partner, Endpoint(args.url))
    started = time.perf_counter()
    with connect(args.db) as conn:
        try:
            window = pipeline.freeze_window(adapter, partner.lag, None, pipeline.RunRequest("full"))
            stats = pipeline.harvest_window(adapter, conn, RunRef("tokens", args.run_id), window)
            outcome = {"ok": True, "ended": f"fetched {stats.fetched:,} records in {stats.pages} pages"}
        except Exception as exc:  # how it failed is the figure
            outcome = {"ok": False, "ended": f"{type(exc).__name__}: {exc}"}
    print(json.dumps({**outcome, "seconds": time.perf_counter() - started, "peak_rss_mib": support.peak_rss_mib()}))


def guard_memory(pages: int, token_bytes: int) -> tuple[float, float]:
    """MiB the loop guard holds after ``pages`` distinct tokens: as a set of tokens (as it
    once was) and as oai/client._Chain keeps them (digests)."""
    from partner_harvest.oai import parse
    from partner_harvest.oai.chain_caps import ChainCaps
    from partner_harvest.oai.client import OaiClient, _Chain

    def tokens() -> Iterator[str]:
        for n in range(pages):
            yield f"{n:08d}" + "x" * (token_bytes - 8)

    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    kept: set[str] = set()
    for token in tokens():
        kept.add(token)
    as_tokens = (tracemalloc.get_traced_memory()[0] - before) / (1 << 20)
    kept.clear()
    token = ""  # the loop's last token is no longer held either
    client = OaiClient("tokens", "http://127.0.0.1:9/oai", None,  # type: ignore[arg-type]
                       caps=ChainCaps(max_token_bytes=2 * token_bytes))
    chain = _Chain(client)
    page = parse.ListPage(items=[parse.OaiHeader("oai:x:1", None)])  # one item: the page is not empty
    before = tracemalloc.get_traced_memory()[0]
    for token in tokens():
        assert chain.check({"verb": "ListRecords", "resumptionToken": "t"}, token, page) is None
    token = ""
    as_digests = (tracemalloc.get_traced_memory()[0] - before) / (1 << 20)
    tracemalloc.stop()
    return as_tokens, as_digests


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--token-mib", type=float, default=8.0)
    parser.add_argument("--pages", type=int, default=40)
    parser.add_argument("--max-extra-mib", type=float, default=64.0)
    support.child_arguments(parser)
    args = parser.parse_args()
    if args.child:
        child(args)
        return 0

    from include.simulators.oai_pmh import OaiSimulator, SimulatedRepository
    from partner_harvest.registry import DEFAULT_MAX_TOKEN_BYTES

    token_bytes = int(args.token_mib * (1 << 20))
    records = 100 * args.pages
    print(f"Tokens: {records:,}-record collection, 100 per page ({args.pages} pages); tokens of "
          f"{token_bytes:,} bytes; cap options.limits.max_token_bytes = {DEFAULT_MAX_TOKEN_BYTES:,} (default)")
    db = support.fresh_database("tokens")
    repo = SimulatedRepository(records=records, page_size=100, seed=23)
    results = {}
    with OaiSimulator(repo) as sim:
        for number, (name, padding) in enumerate((("short tokens (baseline)", 0),
                                                  (f"{args.token_mib:g} MB tokens", token_bytes))):
            sim.pad_tokens(padding)
            result = support.run_child(__file__, "--url", sim.base_url, "--db", db, "--run-id", f"case-{number}")
            results[name] = result
            print(f"\n{name}\n  {result['seconds']:.2f} s, peak RSS {result['peak_rss_mib']:.1f} MiB\n"
                  f"  {result['ended'][:300]}")
    baseline, hostile = results.values()
    extra = hostile["peak_rss_mib"] - baseline["peak_rss_mib"]
    print(f"\npeak RSS against {args.token_mib:g} MB tokens: {hostile['peak_rss_mib']:.1f} MiB, "
          f"{extra:+.1f} MiB over the baseline ({hostile['peak_rss_mib'] / baseline['peak_rss_mib']:.2f}x)")
    as_tokens, as_digests = guard_memory(args.pages, token_bytes)
    print(f"loop guard after {args.pages} distinct {args.token_mib:g} MB tokens: a set of the tokens keeps "
          f"{as_tokens:,.1f} MiB, the digests keep {as_digests * 1024:,.1f} KiB "
          f"({as_tokens / max(as_digests, 1e-6):,.0f}x less)")
    ok = (not hostile["ok"]) and "max_token_bytes" in hostile["ended"] and extra <= args.max_extra_mib
    print(f"the {args.token_mib:g} MB tokens failed the chain at the cap within {args.max_extra_mib:g} MiB: "
          f"{'yes' if ok else 'NO'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
