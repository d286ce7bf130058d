"""The out-of-process control API every simulator serves under ``/_control/``.

Benchmarks and the demo run a simulator as a separate process, so they mutate
its data, move its clock and read its request log over HTTP. ``POST
/_control/<action>`` with a JSON object calls ``_control_<action>(data)``;
``GET /_control/<report>`` reads. The actions all simulators answer alike live
here; each simulator adds its own misbehaviours and reports.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from .clock import iso_seconds
from .loopback import LoopbackHandler, LoopbackServer, Response
from .model import SimulatedModel

CONTROL_PREFIX = "/_control/"


class ControlledServer(LoopbackServer):
    """A loopback server with the shared control actions (mutate, advance_clock,
    clear_requests) and the ``requests`` report.

    Subclasses set `_json_reply` (their JSON flavour) and may add `_report`;
    hook names stay outside ``_control_*`` so no POST can reach them.
    """

    _json_reply: Callable[[int, dict[str, Any]], Response]  # e.g. staticmethod(_json)

    def __init__(self, host: str, port: int, handler: type[LoopbackHandler],
                 model: SimulatedModel[Any], *, keep_alive_timeout: float | None = None,
                 keep_alive_max: int | None = None) -> None:
        super().__init__(host, port, handler, keep_alive_timeout=keep_alive_timeout, keep_alive_max=keep_alive_max)
        self._model = model

    def _report(self, action: str) -> Response | None:
        """The simulator's own GET report named `action`, or None if it has none."""
        return None

    def handle_control(self, method: str, action: str, body: bytes | None) -> Response:
        """Out-of-process control: POST /_control/<action> (JSON) or GET reports."""
        if method == "GET":
            return self._control_get(action)
        try:
            data = json.loads(body or b"{}")
            if not isinstance(data, dict):
                raise ValueError("body must be a JSON object")
            handler = getattr(self, f"_control_{action}", None)
            if handler is None:
                return self._json_reply(404, {"error": f"unknown action: {action}"})
            return self._json_reply(200, handler(data))
        except (ValueError, KeyError, TypeError) as exc:
            return self._json_reply(400, {"error": f"{type(exc).__name__}: {exc}"})

    def _control_get(self, action: str) -> Response:
        if action == "requests":
            with self._lock:
                return self._json_reply(200, {"requests": list(self.requests)})
        report = self._report(action)
        if report is None:
            return self._json_reply(404, {"error": f"unknown report: {action}"})
        return report

    def _control_close_idle_connections(self, data: dict[str, Any]) -> dict[str, Any]:
        return {"closed": self.close_idle_connections()}

    def _control_keep_alive(self, data: dict[str, Any]) -> dict[str, Any]:
        """Set the idle timeout (``timeout`` seconds, null: never) out of process."""
        self.keep_alive_timeout = None if data.get("timeout") is None else float(data["timeout"])
        return {"keep_alive_timeout": self.keep_alive_timeout}

    def _control_mutate(self, data: dict[str, Any]) -> dict[str, Any]:
        model = self._model
        result: dict[str, Any] = {"edited": [], "deleted": [], "added": []}
        with model.lock:  # a harvest in flight sees all of it or none of it
            if data.get("edit"):
                result["edited"] += model.edit(int(data["edit"]))
            if data.get("edit_ids"):
                result["edited"] += model.edit_ids(data["edit_ids"])
            if data.get("delete"):
                result["deleted"] += model.delete(int(data["delete"]))
            if data.get("delete_ids"):
                result["deleted"] += model.delete_ids(data["delete_ids"])
            if data.get("add"):
                result["added"] += model.add(int(data["add"]))
            if data.get("recreate") and hasattr(model, "recreate"):
                result["recreated"] = model.recreate(int(data["recreate"]))
            if data.get("edit_silently") and hasattr(model, "edit_silently"):
                result["edited_silently"] = model.edit_silently(int(data["edit_silently"]))
            if data.get("rename") and hasattr(model, "rename"):
                result["renamed"] = model.rename(str(data["rename"]), restamp=bool(data.get("restamp", True)))
            if data.get("move_sets") and hasattr(model, "move_sets"):
                result["moved"] = model.move_sets(int(data["move_sets"]))
            result["clock"] = iso_seconds(model.clock)
        return result

    def _control_advance_clock(self, data: dict[str, Any]) -> dict[str, Any]:
        return {"clock": iso_seconds(self._model.advance_clock(float(data["seconds"])))}

    def _control_clear_requests(self, data: dict[str, Any]) -> dict[str, Any]:
        self.clear_requests()
        return {"ok": True}
