"""MARC 21 records for simulated bibs: pymarc for the per-record API, a fast
ISO 2709 encoder for the bulk export.

The export path writes bytes itself because pymarc's ``as_marc()`` costs a
couple of hundred microseconds a record, which would make the simulator, not
the harvester, the bottleneck of a 100k-record export. Both paths start from
the same field list, and the tests check they agree byte for byte.

Identifiers: ``001`` holds ``b`` + the 7-digit id WITHOUT check digit
(``b1000001``); the export-only ``907 $a`` holds ``.b`` + id + check digit
(``.b10000013``), which is what production harvesters key on.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime, timedelta, timezone

import pymarc
from pymarc import Field, Indicators, Subfield

from . import marc8
from .catalogue import Bib, check_digit

MAX_RECORD_BYTES = 99_999  # ISO 2709 length field is five digits
EXPORT_ONLY_TAGS = frozenset({"907", "945", "998"})
LEADER_TEMPLATE = "00000n{type}m a2200000 a 4500"  # length/base address zeroed
_RT = b"\x1d"
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_RECORD_TYPES = {"a": "a", "z": "a", "g": "g", "j": "j", "c": "c"}

ControlField = tuple[str, str]
DataField = tuple[str, str, str, tuple[tuple[str, str], ...]]
MarcField = ControlField | DataField
_DAYS: dict[int, tuple[str, str, str]] = {}  # days since epoch -> (yyyy, mm, dd); strftime is slow


def _ymd(epoch: int) -> tuple[str, str, str]:
    day = epoch // 86400
    parts = _DAYS.get(day)
    if parts is None:
        moment = _EPOCH + timedelta(days=day)
        parts = _DAYS[day] = (f"{moment.year:04d}", f"{moment.month:02d}", f"{moment.day:02d}")
    return parts


def _mdy(epoch: int) -> str:
    """Sierra's mm-dd-yy, as in 907 $b/$c and 998 $c."""
    y, m, d = _ymd(epoch)
    return f"{m}-{d}-{y[2:]}"


def _stamp005(epoch: int) -> str:
    y, m, d = _ymd(epoch)
    rest = epoch % 86400
    return f"{y}{m}{d}{rest // 3600:02d}{rest // 60 % 60:02d}{rest % 60:02d}.0"


def leader_for(bib: Bib, export: bool = False) -> str:
    """Leader/09 is "a" (UTF-8), or blank (MARC-8) for a MARC-8 bib in the export."""
    leader = LEADER_TEMPLATE.format(type=_RECORD_TYPES.get(bib.material_type[0], "a"))
    if export and bib.marc8:
        leader = leader[:9] + " " + leader[10:]
    return leader


def _f008(bib: Bib) -> str:
    y, m, d = _ymd(bib.created)
    created = f"{y[2:]}{m}{d}"
    country = bib.country[0].ljust(3)
    return f"{created}s{bib.publish_year:04d}    {country}" + " " * 17 + f"{bib.lang[0]} d"


def _item_fields(bib: Bib) -> list[DataField]:
    """One 945 per item, as only the bibs/marc export carries them."""
    n = bib.number
    created = _mdy(bib.created)
    out: list[DataField] = []
    for k in range(bib.items):
        item = ((n - 1_000_000) * 4 + k) % 9_000_000 + 1_000_000  # 7-digit item number
        out.append(("945", " ", " ", (
            ("g", "1"), ("i", f"3{n:07d}{k:05d}"), ("l", bib.location), ("o", "-"),
            ("p", f"${10 + k % 40}.00"), ("t", "0"), ("z", created),
            ("y", f".i{item:07d}{check_digit(item)}"),
        )))
    return out


def marc_fields(bib: Bib, export: bool = True) -> list[MarcField]:
    """The record's fields in storage order; `export` adds 907/998 and the 945 items."""
    year = str(bib.publish_year)
    fields: list[MarcField] = []
    if not bib.no_ids:
        fields.append(("001", f"b{bib.id}"))
    if not bib.no_005:
        fields.append(("005", _stamp005(bib.updated)))
    fields.append(("008", _f008(bib)))
    if bib.isbn:
        fields.append(("020", " ", " ", (("a", bib.isbn),)))
    fields.append(("040", " ", " ", (("a", "SIM"), ("b", "eng"), ("c", "SIM"))))
    fields.append(("100", "1", " ", (("a", f"{bib.author}."),)))
    if not bib.invalid:
        fields.append(("245", "1", "0", (("a", bib.title),)))
    imprint = (("a", "Springfield :"), ("b", "Simulated Press,"), ("c", f"{year}."))
    fields.append(("264", " ", "1", imprint) if bib.publish_year >= 2012 else ("260", " ", " ", imprint))
    fields.append(("300", " ", " ", (("a", f"{100 + bib.number % 400} p."),)))
    fields.append(("650", " ", "0", (("a", bib.subject),)))
    if export:
        if not bib.no_ids:
            fields.append(("907", " ", " ", (
                ("a", f".b{bib.id}{check_digit(bib.number)}"),
                ("b", _mdy(bib.updated)),
                ("c", _mdy(bib.created)),
            )))
        fields.append(("998", " ", " ", (
            ("a", bib.location), ("b", "0"), ("c", _mdy(bib.created)),
            ("d", bib.material_type[0]), ("e", bib.bcode3), ("f", bib.lang[0]),
        )))
        fields.extend(_item_fields(bib))
    return fields


def bib_marc(bib: Bib, export: bool = True) -> pymarc.Record:
    """A pymarc Record; ``export=False`` is what ``bibs/{id}/marc`` serves (no 907/945/998)."""
    record = pymarc.Record(force_utf8=True, leader=leader_for(bib))
    for f in marc_fields(bib, export):
        if len(f) == 2:
            record.add_field(Field(tag=f[0], data=f[1]))
        else:
            tag, ind1, ind2, subs = f
            record.add_field(Field(tag=tag, indicators=Indicators(ind1, ind2),
                                   subfields=[Subfield(code, value) for code, value in subs]))
    return record


def _encode_field(f: MarcField, to_bytes: Callable[[str], bytes] = str.encode) -> bytes:
    if len(f) == 2:
        return to_bytes(f[1] + "\x1e")
    return to_bytes(f[1] + f[2] + "".join(["\x1f" + code + value for code, value in f[3]]) + "\x1e")


def encode(leader: str, fields: list[MarcField], max_bytes: int | None = None) -> tuple[bytes, int]:
    """ISO 2709 bytes, same as pymarc's ``as_marc()``, and how many 945s were cut.

    With `max_bytes`, trailing 945 fields are dropped until the record fits,
    which is what Sierra's export does to records over 99,999 bytes. A leader whose
    position 9 is blank means MARC-8: the fields are written in MARC-8.
    """
    to_bytes = marc8.encode if leader[9] == " " else str.encode
    encoded = [_encode_field(f, to_bytes) for f in fields]
    dropped = 0
    if max_bytes is not None:
        size = 24 + 12 * len(encoded) + 1 + sum(map(len, encoded)) + 1
        while size > max_bytes and fields[len(encoded) - 1][0] == "945":
            size -= 12 + len(encoded.pop())
            dropped += 1
    entries = []
    offset = 0
    for f, data in zip(fields, encoded):
        entries.append(f"{f[0]}{len(data):04d}{offset:05d}")
        offset += len(data)
    base = 24 + 12 * len(entries) + 1
    head = f"{offset + base + 1:05d}{leader[5:12]}{base:05d}{leader[17:]}{''.join(entries)}\x1e"
    return head.encode() + b"".join(encoded) + _RT, dropped


def export_record(bib: Bib) -> tuple[bytes, bool]:
    """One bib as the bibs/marc export writes it, and whether it was truncated.

    A ``bad_utf8`` bib gets its first title byte replaced by 0xFF (same length, so the
    directory stays valid): the bytes a broken conversion upstream would leave. In a
    MARC-8 record 0xFF is no character either.
    """
    data, dropped = encode(leader_for(bib, export=True), marc_fields(bib, export=True), MAX_RECORD_BYTES)
    if bib.bad_utf8 and not bib.invalid:
        title = b"\x1fa" + (marc8.encode(bib.title) if bib.marc8 else bib.title.encode())
        at = data.find(title)
        if at >= 0:
            data = data[:at + 2] + b"\xff" + data[at + 3:]
    return data, dropped > 0


def marc_in_json(bib: Bib, zero_leader: bool = False) -> dict:
    """MARC-in-JSON of the per-record MARC (the ``marc`` field zeroes its leader)."""
    record = json.loads(bib_marc(bib, export=False).as_json())
    if zero_leader:
        record["leader"] = leader_for(bib)
    return record


def marc_xml(bib: Bib) -> bytes:
    """MARCXML (one namespaced <record>) of the per-record MARC."""
    body = pymarc.record_to_xml(bib_marc(bib, export=False), namespace=True)
    return b'<?xml version="1.0" encoding="UTF-8"?>\n' + body
