"""The loopback server of a simulated museum's IIIF Change Discovery stream.

Faults on demand: ``throttle`` answers the next requests of a path with 429 or 503 and a
Retry-After; ``on_request`` runs before a request is answered (a stream that grows while a
client walks it). The request log (``requests``) lets tests count what a night cost.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from urllib.parse import SplitResult

from ..loopback import LoopbackHandler, LoopbackServer, Response, status_phrase
from .museum import Museum

JSON_LD = 'application/ld+json;profile="http://iiif.io/api/discovery/1/context.json"'
_PAGE = re.compile(r"/stream/page-(\d+)\.json")
_OBJECT = re.compile(r"/objects/(o\d+)(?:/(linked-art\.json|lido\.xml))?")


class IiifServer(LoopbackServer):
    _thread_prefix = "iiif-sim"

    def __init__(self, museum: Museum | None = None, host: str = "127.0.0.1", port: int = 0, *,
                 keep_alive_timeout: float | None = 5.0):
        super().__init__(host, port, _Handler, keep_alive_timeout=keep_alive_timeout)
        self.museum = museum or Museum()
        self.throttle: dict[str, list[tuple[int, int]]] = {}  # path -> [(status, retry_after)], consumed in order
        self.on_request: Callable[[str], None] | None = None
        self.delay = 0.0  # seconds before every answer (a distant or slow partner)
        self._fail_any: list[tuple[int, int | None]] = []  # the next requests of any path fail so

    def fail_next(self, count: int, status: int = 500, retry_after: int | None = None) -> None:
        """The next ``count`` requests (stream or description) answer ``status`` (0: stop failing)."""
        with self._lock:
            self._fail_any = [(status, retry_after)] * count

    @property
    def collection_url(self) -> str:
        return f"{self.base_url}/stream/collection.json"

    def control(self, method: str, action: str, body: bytes | None) -> Response:
        """Out of process (the demo, the soak): POST mutate {edit, delete, add, move} or
        clear_requests; GET live_ids (one identifier a line) or requests."""
        museum = self.museum
        if method == "GET" and action == "live_ids":
            text = "\n".join(sorted(museum.identifier(self.base_url, slug) for slug in list(museum.live)))
            return Response(200, text.encode(), "text/plain")
        if method == "GET" and action == "requests":
            with self._lock:
                return _json({"requests": list(self.requests)})
        data = json.loads(body or b"{}") if method == "POST" else {}
        if action == "mutate":
            done = museum.mutate(**{k: int(data.get(k, 0)) for k in ("edit", "delete", "add", "move")})
            return _json({kind: [museum.identifier(self.base_url, s) for s in slugs] for kind, slugs in done.items()})
        if action == "clear_requests":
            self.clear_requests()
            return _json({"ok": True})
        return Response(404, f"unknown control action {action}\n".encode(), "text/plain")

    def count(self, part: str) -> int:
        """Requests so far whose path contains ``part`` (``/stream/``, ``/objects/``)."""
        with self._lock:
            return sum(1 for r in self.requests if part in r["path"])


class _Handler(LoopbackHandler):
    server_sim: IiifServer

    def _respond(self, url: SplitResult, body: bytes | None) -> Response | None:
        sim = self.sim
        assert isinstance(sim, IiifServer)
        with sim._lock:
            sim.requests.append({"path": url.path, "accept": self.headers.get("Accept")})
        if sim.on_request is not None:
            sim.on_request(url.path)
        if sim.delay and sim._stopping.wait(sim.delay):
            return None
        if "/_control/" in url.path:
            return sim.control(self.command, url.path.split("/_control/", 1)[1], body)
        with sim._lock:
            failure = sim._fail_any.pop(0) if sim._fail_any else None
        if failure is not None:
            status, wait = failure
            headers = {"Retry-After": str(wait)} if wait is not None else {}
            return Response(status, b"simulated failure\n", "text/plain", headers)
        faults = sim.throttle.get(url.path)
        if faults:
            status, wait = faults.pop(0)
            return Response(status, b"slow down\n", "text/plain", {"Retry-After": str(wait)})
        base = sim.base_url
        museum = sim.museum
        if url.path == "/stream/collection.json":
            return _json(museum.collection(base))
        match = _PAGE.fullmatch(url.path)
        if match:
            page = museum.page(base, int(match.group(1)))
            return _json(page) if page is not None else Response(404, b"no such page\n", "text/plain")
        match = _OBJECT.fullmatch(url.path)
        if match:
            slug, kind = match.groups()
            if kind == "lido.xml":
                xml = museum.lido(slug)
                return Response(200, xml, "application/xml") if xml else Response(404, b"gone\n", "text/plain")
            data = museum.linked_art(base, slug)
            if data is None:
                return Response(404, b"not found\n", "text/plain")
            return Response(200, data, "application/ld+json")
        return Response(404, b"unknown path\n", "text/plain")

    def _send(self, response: Response) -> None:
        self.send_response_only(response.status, status_phrase(response.status))
        self.send_header("Content-Type", response.content_type)
        self.send_header("Content-Length", str(len(response.body)))
        for name, value in response.headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(response.body)


def _json(body: object) -> Response:
    return Response(200, json.dumps(body).encode(), JSON_LD)
