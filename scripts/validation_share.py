"""Share of records quarantined, per reason, in real responses: the before/after figure of
docs/operator/validation.md's rules.

    PYTHONPATH=plugins python scripts/validation_share.py tests/fixtures/realworld/validation/*/*

Reads OAI-PMH responses (judged as the harvest does, with the prefix the response's
``<request>`` names), bare MARCXML (each record judged as a ``marc21`` payload), and Sierra
MARC-in-JSON (a ``GET bibs`` page or a list of records, read and judged as the harvester
does). Only interfaces that also existed before the named checks are used, so the same
script run against an older checkout (PYTHONPATH pointing at its plugins) prints "before".
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

from lxml import etree

from partner_harvest.formats import get_format
from partner_harvest.oai import parse
from partner_harvest.records import Rejected, Tombstone
from partner_harvest.sierra import marc

OAI = "{http://www.openarchives.org/OAI/2.0/}"
MARC = "{http://www.loc.gov/MARC21/slim}"
STAMP = datetime(2024, 1, 1, tzinfo=timezone.utc)


def verdicts(path: Path) -> list[str | None]:
    """One entry per record: None when it lands, else the quarantine reason."""
    if path.suffix == ".json":
        data = json.loads(path.read_text(encoding="utf-8"))
        entries = data.get("entries", []) if isinstance(data, dict) else [{"id": str(i), "marc": m} for i, m in enumerate(data)]
        out: list[str | None] = []
        for entry in entries:
            if "marc" not in entry:
                continue
            try:
                record = marc.from_marc_json(entry["marc"])
            except Exception as exc:
                out.append(f"MARC-in-JSON unreadable: {type(exc).__name__}")
                continue
            item = marc.to_item(record, str(entry.get("id")), STAMP)
            out.append(item.reason if isinstance(item, Rejected) else None)
        return out
    root = etree.fromstring(path.read_bytes(), etree.XMLParser(resolve_entities=False, no_network=True))
    if root.tag == f"{OAI}OAI-PMH":
        request = root.find(f"{OAI}request")
        prefix = request.get("metadataPrefix") if request is not None else None
        if root.find(f"{OAI}ListRecords") is None or not prefix:
            return []
        page = parse.parse_list_records(path.read_bytes(), prefix)
        return [i.reason if isinstance(i, Rejected) else None for i in page.items if not isinstance(i, Tombstone)]
    records = [root] if root.tag == f"{MARC}record" else root.findall(f"{MARC}record")
    fmt = get_format("marc21")
    return [fmt.validate(r) for r in records]


def main(paths: list[str]) -> None:
    total, reasons = 0, Counter[str]()
    for name in paths:
        found = verdicts(Path(name))
        total += len(found)
        reasons.update(r for r in found if r is not None)
        held = sum(1 for r in found if r is not None)
        print(f"{name}: {held} of {len(found)} quarantined")
    held = sum(reasons.values())
    print(f"all: {held} of {total} records quarantined ({held / total:.1%})" if total else "no records")
    for reason, n in reasons.most_common():
        print(f"  {n:4d}  {reason}")


if __name__ == "__main__":
    main(sys.argv[1:])
