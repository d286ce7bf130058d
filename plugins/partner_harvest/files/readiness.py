"""The readiness probes of a file-delivery partner (readiness.py; declared in files/spec.py).

What a harvest relies on: the location lists, the patterns date some of its files, at
least one delivery is complete (a full dump to start from, when the partner publishes
them), the chain the first run would apply and where it would wait, and the first records
of the newest complete delivery through the format and the partner's validation. A listing
and one partial read of one file.
"""

from __future__ import annotations

import itertools
from datetime import datetime, timezone
from typing import cast

from partner_harvest.errors import HarvestError
from partner_harvest.files import layout
from partner_harvest.files.harvester import FileDeliveryAdapter
from partner_harvest.readiness import Probe, listed, one_line
from partner_harvest.window import format_instant

SAMPLE = 50  # records of the newest delivery read through the format and validation


def check(probe: Probe) -> None:
    adapter = cast(FileDeliveryAdapter, probe.adapter)
    try:
        found = adapter.layout.list(datetime.now(timezone.utc))
    except HarvestError as exc:
        probe.fail("location", one_line(exc.cause), "the Connection's host must be the location's URL (s3://bucket/"
                   "prefix, https://host/dir/, file:///path) and its credentials must allow listing it",
                   "location-unreadable")
        return
    probe.ok("location", f"{adapter.storage.where} lists")
    if not found:
        probe.fail("patterns", "no file at the location matches options.files.full or delta",
                   "compare the patterns with the files' names ({date:FORMAT} in strftime codes)", "no-deliveries")
        return
    fulls = [d for d in found if d.kind == layout.FULL]
    deltas = [d for d in found if d.kind == layout.DELTA]
    probe.ok("patterns", f"{len(fulls)} full dump(s), {len(deltas)} delta(s), from {format_instant(found[0].date)} "
             f"to {format_instant(found[-1].date)}")
    incomplete = [d for d in found if not d.complete]
    if incomplete:
        late = incomplete[-1]
        probe.warn("completeness", f"{len(incomplete)} delivery(ies) not complete, the newest the {late.kind} of "
                   f"{format_instant(late.date)}: {late.why_not}", "the partner writes the done-marker, checksum "
                   "file or manifest last (or set settle): a delivery without it waits", "delivery-incomplete")
    if adapter.options.full is not None and not any(d.complete for d in fulls):
        probe.fail("full dump", "no complete full dump: the first harvest has nothing to start from",
                   "the partner publishes a full dump (or options.files.full is dropped for a partner of deltas only)",
                   "no-full-dump")
    chain = layout.chain(found, adapter.options.every)
    if chain.deliveries:
        probe.ok("chain", "the first run applies " + listed(
            [f"{d.kind} {format_instant(d.date)}" for d in chain.deliveries], 4))
    if chain.waiting:
        probe.info("chain", f"waiting: {chain.waiting}", "", "chain-waits")
    newest = next((d for d in reversed(found) if d.complete and d.files), None)
    if newest is None:
        return
    first = sorted(newest.files, key=lambda e: e.path)[0]
    try:
        items, _ = adapter.reader.read(adapter.storage, first.path, newest.date, 0)
        sample = [item for item, _ in itertools.islice(items, SAMPLE)]
    except HarvestError as exc:
        probe.fail("format", f"{first.path}: {one_line(exc.cause)}", "options.files.format must describe the files "
                   "(kind, identifier, record for XML)", "unreadable-file")
        return
    if not sample:
        probe.info("format", f"{first.path} holds no record", "", "empty-file")
        return
    probe.validated(sample, f"the first {len(sample)} record(s) of {first.path}")
