"""A real HTTP receiver for webhook tests: a stdlib server on a free local port, in a thread of its own.

It answers each POST with the next scripted status (then 200) and hands every request to the test through a
thread-safe queue, which the test awaits with a timeout.

`silent()` is the slow customer (TESTING.md "Outbound work"): a bounded TCP server that accepts connections and
never answers, counting how many it holds open at once.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import queue
import selectors
import socket
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


class Silent:
    """The never-answering server: its URL, and what it has seen (read them under `lock`)."""

    def __init__(self) -> None:
        self.url = ""
        self.lock = threading.Lock()
        self.accepted = 0
        """Connections accepted so far."""
        self.open = 0
        """Connections held open now (the client has not closed them)."""
        self.max_open = 0
        """The most it ever held open at once."""

    def seen(self) -> tuple[int, int, int]:
        """(accepted, open, max_open), read together."""
        with self.lock:
            return self.accepted, self.open, self.max_open


@contextmanager
def silent(limit: int = 64) -> Iterator[Silent]:
    """Accept on 127.0.0.1 and never answer, until the block ends; at most `limit` connections held (more are
    closed at once, and counted as accepted).

    One thread serves every socket: in each round a connection's end (the client gave up) is counted before any new
    connection is, so a client that gives up one attempt and starts the next is never seen holding both.
    """
    state = Silent()
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(limit)
    listener.setblocking(False)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            events = selector.select(timeout=0.05)
            for key, _ in sorted(events, key=lambda e: e[0].fileobj is listener):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                if sock is listener:
                    _accept()
                    continue
                try:
                    data = sock.recv(65536)
                except OSError:
                    data = b""
                if not data:
                    selector.unregister(sock)
                    sock.close()
                    with state.lock:
                        state.open -= 1

    def _accept() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except BlockingIOError:
                return
            with state.lock:
                state.accepted += 1
                if state.open >= limit:
                    conn.close()
                    continue
                state.open += 1
                state.max_open = max(state.max_open, state.open)
            conn.setblocking(False)
            selector.register(conn, selectors.EVENT_READ)

    thread = threading.Thread(target=serve, name="webhook-silent", daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{listener.getsockname()[1]}/hooks/slow"
    try:
        yield state
    finally:
        stop.set()
        thread.join(WAIT)
        for key in list(selector.get_map().values()):
            sock = key.fileobj
            assert isinstance(sock, socket.socket)
            sock.close()
        selector.close()
