"""A loopback Sierra API that answers our client's requests with bodies recorded from real servers.

The bodies come byte for byte from tests/fixtures/realworld/sierra (see its SOURCES.md).
What the recordings do not hold is built here and says so: the ``Date`` header (fixed),
a bibs/marc summary for a recorded ISO 2709 file (its counts), the id list of a full load's
enumeration (the ids of the recorded records), and, for the 135 scenario, the poison bib's
MARC-in-JSON (pymarc's rendering of its recorded ISO 2709 record).
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import pymarc

CORPUS = Path(__file__).resolve().parents[1] / "fixtures" / "realworld" / "sierra"
API = "/iii/sierra-api/v6"
DATE = "Mon, 01 Dec 2025 00:00:00 GMT"  # built: later than every recorded updatedDate
_ID_907 = re.compile(r"^\.b(\d+)[\dx]$")


def recorded(relative: str) -> bytes:
    return (CORPUS / relative).read_bytes()


def wiremock_body(relative: str) -> tuple[int, bytes]:
    """(status, body bytes) of a recorded WireMock mapping (inline body or its body file)."""
    mapping = json.loads(recorded(relative))
    response = mapping["response"]
    if "bodyFileName" in response:
        return response["status"], recorded(f"wellcome/__files/{response['bodyFileName']}")
    return response["status"], response["body"].encode("utf-8")


NOT_FOUND_107 = wiremock_body("wellcome/mappings/bibs-48b80ead-d492-40af-bace-97cd94cfbafd.json")


@dataclass
class ExportRecord:
    """One recorded ISO 2709 record of an export file, with its bib id (907 $a)."""

    bib_id: int
    raw: bytes


def export_records(*relatives: str) -> list[ExportRecord]:
    out = []
    for relative in relatives:
        data = recorded(relative)
        while data:
            length = int(data[:5])
            raw, data = data[:length], data[length:]
            record = next(iter(pymarc.MARCReader(raw, to_unicode=True, force_utf8=True)))
            match = next(_ID_907.match(v.strip()) for f in record.get_fields("907") for v in f.get_subfields("a"))
            assert match is not None, record
            out.append(ExportRecord(int(match.group(1)), raw))
    return sorted(out, key=lambda r: r.bib_id)


@dataclass
class Replay:
    """What the replay answers; each route is (status, body) or a function of the query."""

    token: bytes = field(default_factory=lambda: recorded("dcb-sandbox/sierra-api-login.json"))
    changes: tuple[int, bytes] = NOT_FOUND_107  # the first change-poll page (id=[0,] or none)
    deletions: tuple[int, bytes] = NOT_FOUND_107
    export: list[ExportRecord] = field(default_factory=list)
    poison: set[int] = field(default_factory=set)  # bibs/marc blocks holding one answer 500/135
    first_bibs_401: bytes | None = None  # the first GET bibs answers 401 with this body
    # GET items / holdings: the change poll's pages by the id the keyset asks from (None or 0:
    # the first page); any other page, and every deletion poll, answers the recorded 404/107.
    attached: dict[str, dict[int, tuple[int, bytes]]] = field(default_factory=dict)
    requests: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)
    files: dict[str, bytes] = field(default_factory=dict)
    base_url: str = ""

    def answer(self, method: str, path: str, query: dict[str, str]) -> tuple[int, bytes, str]:
        self.requests.append((method, path, query))
        rest = path.removeprefix(API)
        if rest == "/token":
            return 200, self.token, "application/json;charset=UTF-8"
        if rest == "/info/token":
            return 200, b'{"keyId":"replay","grantType":"client_credentials"}', "application/json"
        if rest == "/bibs":
            if self.first_bibs_401 is not None:
                body, self.first_bibs_401 = self.first_bibs_401, None
                return 401, body, "application/json;charset=UTF-8"
            return self._bibs(query)
        if rest in ("/items", "/holdings"):
            ids = query.get("id", "")
            low = int(ids.strip("[]").split(",")[0] or 0) if ids.startswith("[") else 0
            pages = self.attached.get(rest[1:], {})
            status, body = pages.get(low, NOT_FOUND_107) if query.get("deleted") != "true" else NOT_FOUND_107
            return status, body, "application/json;charset=UTF-8"
        if rest == "/bibs/marc":
            return self._summary(query)
        if rest.startswith("/bibs/marc/files/"):
            name = rest.rsplit("/", 1)[-1]
            if method == "DELETE":
                self.files.pop(name, None)
                return 204, b"", "text/plain"
            return 200, self.files[name], "application/octet-stream"
        return 404, b'{"code":0,"specificCode":0,"httpStatus":404,"name":"Not Found"}', "application/json"

    def _bibs(self, query: dict[str, str]) -> tuple[int, bytes, str]:
        ids = query.get("id", "")
        low = int(ids.strip("[]").split(",")[0] or 0) if ids.startswith("[") else None
        if query.get("deleted") == "true":
            status, body = self.deletions if low in (None, 0) else NOT_FOUND_107
            return status, body, "application/json;charset=UTF-8"
        if self.export and query.get("fields") in ("id", "id,deleted"):  # a full load's enumeration / probe
            limit = int(query.get("limit", 50))
            entries = [{"id": str(r.bib_id)} for r in self.export if low is None or r.bib_id >= low][:limit]
            if not entries:
                return (*NOT_FOUND_107, "application/json;charset=UTF-8")
            return 200, json.dumps({"total": len(entries), "start": 0, "entries": entries}).encode(), "application/json"
        if self.export and low is None:  # GET bibs?id=a,b,c: MARC-in-JSON rendered from the recorded export
            wanted = {int(i) for i in ids.split(",") if i}
            entries = [self._as_json(r) for r in self.export if r.bib_id in wanted]
            if not entries:
                return (*NOT_FOUND_107, "application/json;charset=UTF-8")
            return 200, json.dumps({"total": len(entries), "start": 0, "entries": entries}).encode(), "application/json"
        status, body = self.changes if low in (None, 0) else NOT_FOUND_107
        return status, body, "application/json;charset=UTF-8"

    @staticmethod
    def _as_json(r: ExportRecord) -> dict[str, Any]:
        record = next(iter(pymarc.MARCReader(r.raw, to_unicode=True, force_utf8=True)))
        stamp = record["005"].data if record.get("005") else "20000101000000.0"
        updated = f"{stamp[0:4]}-{stamp[4:6]}-{stamp[6:8]}T{stamp[8:10]}:{stamp[10:12]}:{stamp[12:14]}Z"
        return {"id": str(r.bib_id), "updatedDate": updated, "deleted": False, "marc": record.as_dict()}

    def _summary(self, query: dict[str, str]) -> tuple[int, bytes, str]:
        low, _, high = query["id"].strip("[]").partition(",")
        limit = int(query.get("limit", 50))
        block = [r for r in self.export if r.bib_id >= int(low) and (not high or r.bib_id <= int(high))][:limit]
        if not block:
            return (*NOT_FOUND_107, "application/json;charset=UTF-8")
        if any(r.bib_id in self.poison for r in block):
            return 500, recorded("brown/bibs-marc-500-135.json"), "application/json;charset=UTF-8"
        name = str(len(self.files) + 1000 + len(self.requests))
        self.files[name] = b"".join(r.raw for r in block)
        summary = {"file": f"{self.base_url}/bibs/marc/files/{name}",
                   "inputRecords": len(block), "outputRecords": len(block), "errors": 0}
        return 200, json.dumps(summary).encode(), "application/json;charset=UTF-8"


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:  # quiet
        pass

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        url = urlsplit(self.path)
        replay: Replay = self.server.replay  # type: ignore[attr-defined]
        with self.server.lock:  # type: ignore[attr-defined]
            status, body, content_type = replay.answer(self.command, url.path, dict(parse_qsl(url.query)))
        self.send_response(status)
        self.send_header("Date", DATE)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_DELETE = _serve


class ReplayServer:
    """``with ReplayServer(Replay(...)) as server:`` ... ``server.base_url``."""

    def __init__(self, replay: Replay) -> None:
        self.replay = replay
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._httpd.replay = replay  # type: ignore[attr-defined]
        self._httpd.lock = threading.Lock()  # type: ignore[attr-defined]
        self._httpd.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self._httpd.server_address[1]}{API}"
        replay.base_url = self.base_url
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    def __enter__(self) -> ReplayServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    # the simulator's names, so the tests' harness takes this server too
    @property
    def requests(self) -> list[tuple[str, str, dict[str, str]]]:
        return self.replay.requests

