"""A small MARC-8 encoder for the simulator's legacy records (Latin script only).

Real catalogues still hold records in MARC-8 (leader/09 blank): combining diacritics
precede their base letter, and a few letters (Ł, ø, Æ, ß...) have their own code. The
simulator writes such records so a harvester must convert them, not mangle them.
"""

from __future__ import annotations

import unicodedata

# ANSEL spacing letters (MARC-8 extended Latin, G1).
_SPACING = {
    "Ł": 0xA1, "Ø": 0xA2, "Đ": 0xA3, "Þ": 0xA4, "Æ": 0xA5, "Œ": 0xA6,
    "ł": 0xB1, "ø": 0xB2, "đ": 0xB3, "þ": 0xB4, "æ": 0xB5, "œ": 0xB6, "ı": 0xB8, "ß": 0xC7,
}
# ANSEL combining marks; in MARC-8 they come BEFORE the letter they modify.
_COMBINING = {
    "\u0309": 0xE0, "\u0300": 0xE1, "\u0301": 0xE2, "\u0302": 0xE3, "\u0303": 0xE4, "\u0304": 0xE5,
    "\u0306": 0xE6, "\u0307": 0xE7, "\u0308": 0xE8, "\u030c": 0xE9, "\u030a": 0xEA, "\u030b": 0xEE,
    "\u0327": 0xF0, "\u0328": 0xF1, "\u0323": 0xF2,
}


def encode(text: str) -> bytes:
    """`text` in MARC-8; ValueError for a character outside basic and extended Latin."""
    out = bytearray()
    pending: list[int] = []  # combining marks seen after the current base letter
    base: bytes | None = None
    for char in unicodedata.normalize("NFD", text):
        if char in _COMBINING:
            if base is None:
                raise ValueError(f"combining mark without a base letter in {text!r}")
            pending.append(_COMBINING[char])
            continue
        if base is not None:
            out += bytes(pending) + base
        pending = []
        if char.isascii() and (char.isprintable() or char in "\x1e\x1f"):
            base = char.encode("ascii")
        elif char in _SPACING:
            base = bytes([_SPACING[char]])
        else:
            raise ValueError(f"{char!r} has no MARC-8 encoding here")
    if base is not None:
        out += bytes(pending) + base
    return bytes(out)


def encodable(text: str) -> bool:
    try:
        encode(text)
    except ValueError:
        return False
    return True
