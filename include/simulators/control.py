"""The out-of-process control API every simulator serves under ``/_control/``.

Benchmarks and the demo run a simulator as a separate process, so they mutate
its data, move its clock and read its request log over HTTP. ``POST
/_control/<action>`` with a JSON object calls ``_control_<action>(data)``;
``GET /_control/<report>`` reads. The actions all simulators answer alike live
here, the faults among them (``POST /_control/faults``, ``faults.py``); each simulator adds
its own reports and the older fault actions its clients post.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

from .clock import iso_seconds
from .faults import Faults
from .loopback import LoopbackHandler, LoopbackServer, Response
from .model import SimulatedModel

CONTROL_PREFIX = "/_control/"
F = TypeVar("F", bound=Faults)
# An older fault action: (the faults now, its JSON body) -> the fields it changes.
FaultAction = Callable[[Any, dict[str, Any]], dict[str, Any]]


class ControlledServer(LoopbackServer, Generic[F]):
    """A loopback server with the shared control actions (mutate, advance_clock,
    clear_requests, faults), the ``requests`` and ``faults`` reports, and its faults.

    Subclasses set `_json_reply` (their JSON flavour) and may add `_report` and
    `_fault_actions`; hook names stay outside ``_control_*`` so no POST can reach them.
    """

    _json_reply: Callable[[int, dict[str, Any]], Response]  # e.g. staticmethod(_json)
    _fault_actions: Mapping[str, FaultAction] = {}

    def __init__(self, host: str, port: int, handler: type[LoopbackHandler],
                 model: SimulatedModel[Any], faults: F, *, keep_alive_timeout: float | None = None,
                 keep_alive_max: int | None = None) -> None:
        super().__init__(host, port, handler, keep_alive_timeout=keep_alive_timeout, keep_alive_max=keep_alive_max)
        self._model = model
        self.faults = faults  # replaced whole (under the lock), never changed in place

    # ------------------------------------------------------------------ faults
    def set_faults(self, **changes: Any) -> F:
        """Change some faults (validated: ValueError on a bad value); the faults now."""
        return self.change_faults(lambda faults: changes)

    def change_faults(self, changes: Callable[[F], dict[str, Any]]) -> F:
        """`set_faults` with changes made from the faults as they are (under the lock)."""
        with self._lock:
            self.faults = self.faults.changed(**changes(self.faults))
            self._faults_changed()
            return self.faults

    def take_fault(self, *names: str, applies: Callable[[str, Any], bool] | None = None) -> tuple[str, Any]:
        """The first one-shot fault of `names` that is set (and `applies` to this request),
        spent for it: (name, value), or ("", None) when none is."""
        with self._lock:
            return self._spend_fault(*names, applies=applies)

    def _spend_fault(self, *names: str, applies: Callable[[str, Any], bool] | None = None) -> tuple[str, Any]:
        """`take_fault` with the lock held."""
        for name in names:
            value = getattr(self.faults, name)
            if value and (applies is None or applies(name, value)):
                self.faults = self.faults.spend(name)
                return name, value
        return "", None

    def _faults_changed(self) -> None:
        """Called with the lock held after the faults changed (wake what waits on them)."""

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
            if action == "faults":
                return self._json_reply(200, self.set_faults(**data).report())
            fault_action = self._fault_actions.get(action)
            if fault_action is not None:
                self.change_faults(lambda faults: fault_action(faults, data))
                return self._json_reply(200, {"ok": True})
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
        if action == "faults":
            return self._json_reply(200, self.faults.report())
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
