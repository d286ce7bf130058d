"""A folder served over HTTP as directory listings, as nginx's autoindex or Apache's mod_autoindex do.

Files answer GET and HEAD with Content-Length, Last-Modified and an ETag (size and
modification time, as nginx makes it) and honour single byte ranges (206); a folder
answers an HTML page of links. What real servers vary, it varies: ``ranges=False``
ignores Range headers (a resumed read must then skip what it has), ``etags=False`` sends
no ETag (the client falls back to Last-Modified). The request log counts what a run cost.
"""

from __future__ import annotations

import email.utils
import html
import os
import re
from pathlib import Path
from urllib.parse import SplitResult, quote, unquote

from ..loopback import LoopbackHandler, LoopbackServer, Response, status_phrase

_RANGE = re.compile(r"bytes=(\d+)-(\d*)$")


class DirectoryServer(LoopbackServer):
    _thread_prefix = "files-sim"

    def __init__(self, folder: str | Path, host: str = "127.0.0.1", port: int = 0, *, ranges: bool = True,
                 etags: bool = True, keep_alive_timeout: float | None = 5.0):
        super().__init__(host, port, _Handler, keep_alive_timeout=keep_alive_timeout)
        self.folder = Path(folder).resolve()
        self.ranges, self.etags = ranges, etags

    def count(self, method: str = "GET") -> int:
        with self._lock:
            return sum(1 for r in self.requests if r["method"] == method)


class _Handler(LoopbackHandler):
    def do_HEAD(self) -> None:
        self._dispatch(None)

    def _respond(self, url: SplitResult, body: bytes | None) -> Response | None:
        sim = self.sim
        assert isinstance(sim, DirectoryServer)
        with sim._lock:
            sim.requests.append({"method": self.command, "path": url.path, "range": self.headers.get("Range")})
        target = (sim.folder / unquote(url.path).lstrip("/")).resolve()
        if target != sim.folder and sim.folder not in target.parents:
            return Response(403, b"outside the folder\n", "text/plain")
        if target.is_dir():
            if not url.path.endswith("/"):
                return Response(301, b"", "text/plain", {"Location": url.path + "/"})
            return self._listing(url.path, target)
        if not target.is_file():
            return Response(404, b"not found\n", "text/plain")
        stat = target.stat()
        headers = {"Last-Modified": email.utils.formatdate(stat.st_mtime, usegmt=True), "Accept-Ranges": "bytes"}
        if sim.etags:
            headers["ETag"] = f'"{int(stat.st_mtime_ns // 1000):x}-{stat.st_size:x}"'
        wanted = _RANGE.match(self.headers.get("Range") or "") if sim.ranges else None
        if not sim.ranges:
            headers["Accept-Ranges"] = "none"
        with target.open("rb") as handle:
            if wanted is not None:
                start = int(wanted.group(1))
                end = int(wanted.group(2)) if wanted.group(2) else stat.st_size - 1
                end = min(end, stat.st_size - 1)
                if start >= stat.st_size:
                    return Response(416, b"", "text/plain", {"Content-Range": f"bytes */{stat.st_size}"})
                handle.seek(start)
                data = handle.read(end - start + 1) if self.command == "GET" else b""
                headers["Content-Range"] = f"bytes {start}-{end}/{stat.st_size}"
                return Response(206, data, "application/octet-stream",
                                {**headers, "X-Length": str(end - start + 1)})
            data = handle.read() if self.command == "GET" else b""
        return Response(200, data, "application/octet-stream", {**headers, "X-Length": str(stat.st_size)})

    @staticmethod
    def _listing(path: str, folder: Path) -> Response:
        names = sorted(os.listdir(folder))
        links = "".join(f'<a href="{quote(n)}{"/" if (folder / n).is_dir() else ""}">{html.escape(n)}</a>\n'
                        for n in names)
        page = f"<html><head><title>Index of {html.escape(path)}</title></head><body><pre>{links}</pre></body></html>"
        return Response(200, page.encode(), "text/html; charset=utf-8")

    def _send(self, response: Response) -> None:
        length = response.headers.pop("X-Length", str(len(response.body)))
        self.send_response_only(response.status, status_phrase(response.status))
        self.send_header("Content-Type", response.content_type)
        self.send_header("Content-Length", length)
        for name, value in response.headers.items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(response.body)
