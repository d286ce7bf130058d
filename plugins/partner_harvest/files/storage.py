"""The partner's location: an fsspec filesystem (what Airflow's ObjectStoragePath wraps) and a root.

The Airflow layer opens the filesystem from the partner's Connection through Airflow's
object storage (``Endpoint.filesystem``: ``ObjectStoragePath(url, conn_id=...).fs`` for a
scheme a provider registers, S3 through the Amazon provider); elsewhere (tests, benchmarks,
a scheme no provider registers such as an HTTP directory) :meth:`Storage.for_endpoint`
opens it with fsspec from the same Connection fields: the URL, login and password (the
store's key and secret, or Basic credentials), and the extras ``endpoint_url`` and
``region_name``. Credentials are never part of a path, a log line or an error.
"""

from __future__ import annotations

import io
import logging
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import IO, Any
from urllib.parse import urlsplit, urlunsplit

import fsspec

from partner_harvest.errors import ConfigurationError, PartnerDataError

log = logging.getLogger(__name__)

BLOCK = 8 * 1024 * 1024  # read-ahead of a remote file: one request per 8 MB


@dataclass(frozen=True)
class Entry:
    """A file at the location: its path below the root, size (-1: the listing did not say), ETag (or
    modification time) and when modified."""

    path: str
    size: int
    etag: str | None
    modified: datetime | None


class Storage:
    """Lists and reads the files below ``root`` of ``fs``; ``where`` names the location in messages."""

    def __init__(self, partner_id: str, fs: Any, root: str, where: str):
        self.partner_id, self.fs, self.where = partner_id, fs, where
        self.root = root.rstrip("/")

    @classmethod
    def for_endpoint(cls, partner_id: str, endpoint: Any) -> Storage:
        """The Connection's location: its filesystem as the Airflow layer opened it, else fsspec's."""
        url = endpoint.base_url
        parts = urlsplit(url)
        host = (parts.hostname or "") + (f":{parts.port}" if parts.port else "")
        where = urlunsplit((parts.scheme, host, parts.path.rstrip("/"), "", ""))  # never the userinfo
        given = getattr(endpoint, "filesystem", None)
        if given is not None:
            root = given._strip_protocol(url)
            return cls(partner_id, given, root if isinstance(root, str) else url, where)
        scheme = parts.scheme or "file"
        extra = dict(endpoint.extra or {})
        options: dict[str, Any] = {}
        if scheme in ("s3", "s3a"):
            client: dict[str, Any] = {}
            if extra.get("endpoint_url"):
                client["endpoint_url"] = extra["endpoint_url"]
            if extra.get("region_name"):
                client["region_name"] = extra["region_name"]
            options = {"key": endpoint.login or None, "secret": endpoint.password or None, "client_kwargs": client,
                       "anon": not endpoint.login and not extra.get("endpoint_url"), "use_listings_cache": False}
        elif scheme in ("http", "https"):
            if endpoint.login:
                import aiohttp

                options = {"client_kwargs": {"auth": aiohttp.BasicAuth(endpoint.login, endpoint.password or "")}}
            options["block_size"] = BLOCK
        elif scheme != "file":
            raise ConfigurationError(partner_id, f"location {where}", f"the scheme {scheme!r} has no filesystem here: "
                                     "use s3, http(s) or file (other schemes through a provider's object storage)")
        try:
            fs, root = fsspec.core.url_to_fs(url, skip_instance_cache=True, **options)
        except (ImportError, ValueError) as exc:
            raise ConfigurationError(partner_id, f"location {where}", f"cannot open it: {exc}") from None
        return cls(partner_id, fs, root, where)

    # -- listing -------------------------------------------------------------------------

    def find(self, prefix: str, depth: int) -> list[Entry]:
        """The files below ``prefix`` (relative), at most ``depth`` levels down."""
        base = f"{self.root}/{prefix}".rstrip("/") if prefix else self.root
        self.fs.invalidate_cache()  # a listing is read now, never from an earlier one
        try:
            found = self.fs.find(base, maxdepth=depth, detail=True)
        except FileNotFoundError:
            return []
        except Exception as exc:
            raise PartnerDataError(self.partner_id, f"list {self.where}/{prefix}", _one_line(exc)) from None
        entries = []
        for name, info in sorted(found.items()):
            if info.get("type") == "directory":
                continue
            path = self._relative(name)
            if path is not None:
                entries.append(self._entry(path, info))
        return entries

    def complete(self, entry: Entry) -> Entry:
        """An entry a listing gave without its size (an HTTP directory page): asked for once (HEAD)."""
        if entry.size >= 0:
            return entry
        return self.info(entry.path) or entry

    def info(self, path: str) -> Entry | None:
        """One file now, or None when it is not there."""
        self.fs.invalidate_cache(self._full(path))
        try:
            info = self.fs.info(self._full(path))
        except FileNotFoundError:
            return None
        except Exception as exc:
            raise PartnerDataError(self.partner_id, f"stat {self.where}/{path}", _one_line(exc)) from None
        return None if info.get("type") == "directory" else self._entry(path, info)

    def read_small(self, path: str, cap: int = 16 * 1024 * 1024) -> bytes:
        """A small file whole (a checksum file, a manifest), capped."""
        with self.open(path) as handle:
            data = handle.read(cap + 1)
        if len(data) > cap:
            raise PartnerDataError(self.partner_id, f"read {self.where}/{path}", f"longer than {cap} bytes")
        return data

    def open(self, path: str, offset: int = 0) -> IO[bytes]:
        """The file as a binary stream from ``offset``: a seek where the store serves ranges,
        else read and dropped up to it (an HTTP server without Range support)."""
        try:
            handle = self.fs.open(self._full(path), "rb", block_size=BLOCK)
        except FileNotFoundError:
            raise PartnerDataError(self.partner_id, f"read {self.where}/{path}", "the file is gone (removed or "
                                   "replaced since the window froze)") from None
        except Exception as exc:
            raise PartnerDataError(self.partner_id, f"read {self.where}/{path}", _one_line(exc)) from None
        if offset:
            try:
                handle.seek(offset)
            except (ValueError, OSError, io.UnsupportedOperation):
                handle.close()
                handle = self.fs.open(self._full(path), "rb", block_size=BLOCK)
                _skip(handle, offset)
        return handle

    # -- helpers -------------------------------------------------------------------------

    def _full(self, path: str) -> str:
        return f"{self.root}/{path}"

    def _relative(self, name: str) -> str | None:
        stripped = self.fs._strip_protocol(name) if not name.startswith(self.root) else name
        if not isinstance(stripped, str) or not stripped.startswith(self.root + "/"):
            return None
        return stripped[len(self.root) + 1:]

    @staticmethod
    def _entry(path: str, info: dict[str, Any]) -> Entry:
        modified = info.get("LastModified") or info.get("mtime") or info.get("Last-Modified") or info.get("created")
        when: datetime | None = None
        if isinstance(modified, datetime):
            when = modified if modified.tzinfo else modified.replace(tzinfo=timezone.utc)
        elif isinstance(modified, (int, float)):
            when = datetime.fromtimestamp(modified, timezone.utc)
        elif isinstance(modified, str):
            from email.utils import parsedate_to_datetime

            try:
                when = parsedate_to_datetime(modified)
            except (TypeError, ValueError):
                when = None
        etag = info.get("ETag") or info.get("etag") or info.get("Last-Modified")
        if etag is None and when is not None:
            etag = f"mtime:{when.timestamp():.6f}"
        size = info.get("size")
        return Entry(path, int(size) if size is not None else -1, str(etag).strip('"') if etag else None, when)


def _skip(handle: IO[bytes], count: int) -> None:
    while count > 0:
        chunk = handle.read(min(count, BLOCK))
        if not chunk:
            return
        count -= len(chunk)


def _one_line(exc: BaseException) -> str:
    return " ".join(f"{type(exc).__name__}: {exc}".split())[:500]
