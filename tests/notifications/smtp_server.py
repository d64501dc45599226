"""A real SMTP server for the email tests: aiosmtpd's Controller on a free local port (it does not take port 0),
in a thread of its own. Its handler records every message it accepts and answers, on demand, a recipient's next
DATA with a scripted reply (451: try later; 550: never), so a test can make one recipient's server fail."""

from __future__ import annotations

import email
import email.policy
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from email.message import EmailMessage
from typing import Any

from aiosmtpd.controller import Controller

from tests.helpers import free_port

PUBLIC = "https://space.example.test"
"""SPACE_PUBLIC_URL of the emailing tests: what every link in their emails starts with."""


@dataclass(frozen=True)
class Received:
    """One message as the server accepted it: the envelope and the bytes of the message."""

    mail_from: str
    rcpt_tos: list[str]
    content: bytes

    @property
    def message(self) -> EmailMessage:
        """The message parsed by the standard library (headers, parts)."""
        parsed = email.message_from_bytes(self.content, policy=email.policy.default)
        assert isinstance(parsed, EmailMessage)
        return parsed

    def part(self, subtype: str) -> str:
        """The text of the `text/<subtype>` part, its lines ending in "\n" (SMTP sends CRLF)."""
        body = self.message.get_body(preferencelist=(subtype,))
        assert body is not None and body.get_content_type() == f"text/{subtype}", self.content
        text: str = body.get_content()
        return text.replace("\r\n", "\n")


class Recorder:
    """The handler: the messages accepted, every DATA tried, and the replies scripted per recipient."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.received: list[Received] = []
        self.tries: list[tuple[str, str]] = []
        self.scripted: dict[str, list[str]] = {}

    def answer(self, recipient: str, *replies: str) -> None:
        """Answer `recipient`'s next DATA commands with `replies` (e.g. "451 4.3.0 Try again later"), then accept."""
        with self.lock:
            self.scripted.setdefault(recipient.lower(), []).extend(replies)

    def to(self, recipient: str) -> list[Received]:
        """The messages accepted for `recipient`."""
        with self.lock:
            return [r for r in self.received if recipient.lower() in (t.lower() for t in r.rcpt_tos)]

    def tried(self, recipient: str) -> list[str]:
        """What the server answered each DATA for `recipient`, in order."""
        with self.lock:
            return [reply for rcpt, reply in self.tries if rcpt == recipient.lower()]

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        """Accept and record the message, or give the recipient's next scripted reply."""
        rcpts = [str(r).lower() for r in envelope.rcpt_tos]
        with self.lock:
            reply = "250 Message accepted for delivery"
            for rcpt in rcpts:
                if self.scripted.get(rcpt):
                    reply = self.scripted[rcpt].pop(0)
            for rcpt in rcpts:
                self.tries.append((rcpt, reply))
            if reply.startswith("250"):
                self.received.append(Received(str(envelope.mail_from), rcpts, bytes(envelope.original_content)))
        return reply


@dataclass(frozen=True)
class SmtpServer:
    """The running server: where it listens and what it recorded."""

    host: str
    port: int
    recorder: Recorder

    @property
    def url(self) -> str:
        """SPACE_SMTP_URL of this server."""
        return f"smtp://{self.host}:{self.port}"


@contextmanager
def smtp_server() -> Iterator[SmtpServer]:
    """Serve SMTP on 127.0.0.1 until the block ends."""
    recorder = Recorder()
    port = free_port()
    # decode_data=False keeps the bytes as sent (original_content), which the tests parse themselves.
    controller = Controller(recorder, hostname="127.0.0.1", port=port, decode_data=False)
    controller.start()
    try:
        yield SmtpServer("127.0.0.1", port, recorder)
    finally:
        controller.stop()
