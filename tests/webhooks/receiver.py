"""A real HTTP receiver for webhook tests: a stdlib server on a free local port, in a thread of its own.

It answers each POST with the next scripted status (then 200) and hands every request to the test through a
thread-safe queue, which the test awaits with a timeout.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import queue
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

WAIT = 15.0


@dataclass(frozen=True)
class Received:
    """One request as the receiver saw it."""

    path: str
    headers: dict[str, str]
    body: bytes


class Receiver:
    """The running server: its URL, the scripted answers, the requests received."""

    def __init__(self, statuses: list[int]) -> None:
        self.statuses = list(statuses)
        self.inbox: queue.Queue[Received] = queue.Queue()
        self.count = 0
        self.url = ""

    async def next(self) -> Received:
        """The next request received (fails after WAIT seconds)."""
        try:
            return await asyncio.to_thread(self.inbox.get, True, WAIT)
        except queue.Empty:
            raise AssertionError("the receiver got no request in time") from None


@contextmanager
def receiver(statuses: list[int] | None = None) -> Iterator[Receiver]:
    """Serve on 127.0.0.1 until the block ends."""
    state = Receiver(statuses or [])
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length") or 0))
            with lock:
                status = state.statuses.pop(0) if state.statuses else 200
                state.count += 1
            self.send_response(status)
            self.send_header("content-length", "0")
            self.end_headers()
            state.inbox.put(Received(self.path, {k.lower(): v for k, v in self.headers.items()}, body))

        def log_message(self, format: str, *args: object) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, name="webhook-receiver", daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}/hooks/space"
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(WAIT)


def verifies(secret: str, got: Received) -> bool:
    """Standard Webhooks verification, written from the convention with the standard library only."""
    key = base64.b64decode(secret.split("_", 1)[1])
    signed = f"{got.headers['webhook-id']}.{got.headers['webhook-timestamp']}.".encode() + got.body
    expected = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    # The header may carry several space-separated signatures (key rotation); one must match.
    offered = [s.split(",", 1)[1] for s in got.headers["webhook-signature"].split() if s.startswith("v1,")]
    return any(hmac.compare_digest(expected, s) for s in offered)
