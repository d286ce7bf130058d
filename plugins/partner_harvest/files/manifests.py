"""What a delivery says about itself: a checksum file, a ResourceSync resource list or change list.

Each reader returns the files listed, by path relative to the location (a listed name is
taken relative to the list's own folder), with the length (when given) and the digest as
``algorithm:hex`` (``sha256``, ``md5``, ``sha1``, ``sha512``; None when not given).
"""

from __future__ import annotations

import re
from posixpath import basename

from partner_harvest.errors import PartnerDataError
from partner_harvest.xmlsafe import XmlInputError, parse_document

Listed = dict[str, tuple["int | None", "str | None"]]

_BY_LENGTH = {32: "md5", 40: "sha1", 64: "sha256", 128: "sha512"}
_GNU = re.compile(r"^([0-9a-fA-F]{32,128})\s+\*?(.+?)\s*$")  # sha256sum / md5sum: "hex  name"
_BSD = re.compile(r"^(MD5|SHA1|SHA256|SHA512)\s*\((.+)\)\s*=\s*([0-9a-fA-F]+)\s*$")  # BSD: "SHA256 (name) = hex"
RS = "http://www.openarchives.org/rs/terms/"
SITEMAP = "http://www.sitemaps.org/schemas/sitemap/0.9"
_RS_ALGORITHMS = {"md5": "md5", "sha-1": "sha1", "sha-256": "sha256", "sha-512": "sha512"}


def checksum_file(data: bytes, base: str, where: str) -> Listed:
    """``sha256sum``/``md5sum`` output (GNU or BSD style), one file a line."""
    listed: Listed = {}
    for number, raw in enumerate(data.decode("utf-8", "replace").splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        gnu = _GNU.match(line)
        if gnu and len(gnu.group(1)) in _BY_LENGTH:
            hexdigest, name = gnu.group(1), gnu.group(2)
            algorithm = _BY_LENGTH[len(hexdigest)]
        else:
            bsd = _BSD.match(line)
            if bsd is None:
                raise PartnerDataError("", f"read {where}/{base}", f"checksum file line {number} is neither "
                                       f"'hex  name' nor 'ALGO (name) = hex': {line[:80]!r}")
            algorithm, name, hexdigest = bsd.group(1).lower(), bsd.group(2), bsd.group(3)
        listed[base + name.lstrip("./")] = (None, f"{algorithm}:{hexdigest.lower()}")
    return listed


def resourcesync(data: bytes, base: str, where: str) -> Listed:
    """A ResourceSync resource list or change list (a sitemap ``urlset``): each ``<url>``'s
    ``loc`` (its last path segment, beside the list) with ``rs:md`` length and hash; resources
    a change list marks deleted are no file to read."""
    try:
        root = parse_document(data).root
    except XmlInputError as exc:
        raise PartnerDataError("", f"read {where}/{base}", f"ResourceSync list: {exc.cause}") from None
    if root.tag != f"{{{SITEMAP}}}urlset":
        raise PartnerDataError("", f"read {where}/{base}", f"ResourceSync list: the root is {root.tag!s}, not a "
                               "sitemap urlset")
    listed: Listed = {}
    for url in root.iterfind(f"{{{SITEMAP}}}url"):
        loc = (url.findtext(f"{{{SITEMAP}}}loc") or "").strip()
        md = url.find(f"{{{RS}}}md")
        if not loc or (md is not None and md.get("change") == "deleted"):
            continue
        length = md.get("length") if md is not None else None
        digest = None
        for token in (md.get("hash") or "").split() if md is not None else ():
            algorithm, _, value = token.partition(":")
            if algorithm.lower() in _RS_ALGORITHMS and value:
                digest = f"{_RS_ALGORITHMS[algorithm.lower()]}:{_hex(value)}"
                if algorithm.lower() == "sha-256":
                    break
        listed[base + basename(loc.rstrip("/"))] = (int(length) if length and length.isdigit() else None, digest)
    return listed


def _hex(value: str) -> str:
    """ResourceSync writes md5 in hex (and some servers base64): hex either way."""
    if re.fullmatch(r"[0-9a-fA-F]+", value):
        return value.lower()
    import base64
    import binascii

    try:
        return base64.b64decode(value, validate=True).hex()
    except (binascii.Error, ValueError):
        return value
