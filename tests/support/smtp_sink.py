"""A local SMTP sink on 127.0.0.1 that keeps every message it receives.

The e2e tests point the ``harvest_alerts_smtp`` Connection at it, so a failure alert
sent by a real Airflow task process can be read back and asserted on. Plain SMTP only
(no TLS, no AUTH): the Connection sets ``disable_tls``/``disable_ssl``.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from email import message_from_bytes, policy
from email.message import EmailMessage
from typing import Any

from aiosmtpd.controller import Controller

from tests.support.airflow_stack import free_loopback_port


@dataclass(frozen=True)
class ReceivedMail:
    """One delivered message: the SMTP envelope and the parsed content."""

    mail_from: str
    rcpt_tos: tuple[str, ...]
    message: EmailMessage
    received_at: float = field(default_factory=time.time)  # epoch seconds, when the sink accepted it

    @property
    def subject(self) -> str:
        return str(self.message.get("Subject", ""))

    @property
    def body(self) -> str:
        """Every text part joined, so assertions need not know plain text from HTML."""
        parts = []
        for part in self.message.walk():
            if part.get_content_maintype() == "text":
                parts.append(part.get_content())
        return "\n".join(parts)

    @property
    def text(self) -> str:
        return f"{self.subject}\n{self.body}"


class _Handler:
    """aiosmtpd handler: parse and store each message, accept it."""

    def __init__(self, sink: SmtpSink) -> None:
        self._sink = sink

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        raw = envelope.original_content or envelope.content
        message = message_from_bytes(raw, policy=policy.default)
        self._sink._store(ReceivedMail(envelope.mail_from, tuple(envelope.rcpt_tos), message))
        return "250 Message accepted for delivery"


class SmtpSink:
    """Context manager: ``with SmtpSink() as sink: ... sink.port ... sink.wait_for(...)``."""

    def __init__(self, host: str = "127.0.0.1", port: int | None = None) -> None:
        self.host = host
        # aiosmtpd's readiness check connects to the configured port, so port 0 cannot work.
        self.port = port or free_loopback_port()
        self._messages: list[ReceivedMail] = []
        self._cond = threading.Condition()
        self._controller = Controller(_Handler(self), hostname=host, port=self.port, ready_timeout=10)

    @property
    def messages(self) -> list[ReceivedMail]:
        with self._cond:
            return list(self._messages)

    def _store(self, mail: ReceivedMail) -> None:
        with self._cond:
            self._messages.append(mail)
            self._cond.notify_all()

    def wait_for(self, predicate: Any, timeout: float) -> ReceivedMail | None:
        """The first message matching ``predicate``, waiting up to ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for mail in self._messages:
                    if predicate(mail):
                        return mail
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self._cond.wait(remaining)

    def start(self) -> SmtpSink:
        self._controller.start()
        return self

    def stop(self) -> None:
        self._controller.stop()

    def __enter__(self) -> SmtpSink:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
