"""How a download goes out over HTTP: at most `SPACE_DOWNLOAD_CONCURRENCY` stream at once per API process.

The body itself comes from the store one part at a time (`storage.PgResultStore.read`), so each download in
flight holds about one part; the cap bounds how many parts a process holds, and how many of its database
connections downloads can keep busy.

The slot is taken when the response starts and given back when it ends, in one `try`/`finally` around the
whole ASGI response: whether the body was sent, failed midway (ResultMissing) or its client went away, and
even when the response never got to stream (a disconnect before the first byte). Taking it in the handler
would leak it whenever something between the handler and the response failed (the request's commit runs
there). The handler has authorized the caller by then (SPEC §6's order), so a busy server never answers a
request that would have been refused.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

from litestar import Request
from litestar.response import Stream
from litestar.response.base import ASGIResponse
from litestar.types import Message, Receive, Scope, Send

from space.errors import Busy, problem_for
from space.observability import metrics

BUSY_RETRY_AFTER = 5
"""Seconds a client is asked to wait when every download slot of the process is taken."""


class DownloadSlots:
    """The downloads this process streams now, at most `limit`: a full house refuses, it never queues.

    One event loop serves the process and `take` never awaits, so nothing runs between its check and its count.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.in_use = 0

    def take(self) -> bool:
        """Take a slot if one is free."""
        if self.in_use >= self.limit:
            return False
        self.in_use += 1
        return True

    def release(self) -> None:
        """Give a taken slot back."""
        self.in_use -= 1


class DownloadStream(Stream):
    """A result streamed to its client while it holds a download slot; 503 `busy` when none is free."""

    __slots__ = ("slots", "via")

    def __init__(
        self, content: AsyncIterator[bytes], *, slots: DownloadSlots, via: str = "bearer", **kwargs: Any
    ) -> None:
        super().__init__(content, **kwargs)
        self.slots = slots
        self.via = via
        """How the download was authorized (`bearer` or `link`): the label of `space_downloads_total`."""

    def to_asgi_response(self, app: Any, request: Request[Any, Any, Any], **kwargs: Any) -> ASGIResponse:
        """The stream's ASGI response inside the slot guard."""
        stream = super().to_asgi_response(app, request, **kwargs)

        def busy() -> ASGIResponse:
            error = Busy(
                f"This server streams at most {self.slots.limit} downloads at once; try again shortly.",
                headers={"Retry-After": str(BUSY_RETRY_AFTER)},
            )
            return problem_for(error).to_asgi_response(None, request)

        return _InSlot(stream, self.slots, busy, self.via)


class _InSlot(ASGIResponse):
    """Sends `stream` while holding a slot, or the busy answer; an ASGIResponse only so Litestar can send it."""

    __slots__ = ("_busy", "_slots", "_stream", "_via")

    def __init__(
        self, stream: ASGIResponse, slots: DownloadSlots, busy: Callable[[], ASGIResponse], via: str = "bearer"
    ) -> None:
        super().__init__(status_code=stream.status_code)
        self._stream = stream
        self._slots = slots
        self._busy = busy
        self._via = via

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # A HEAD response streams nothing, so it takes no slot.
        if self._stream.is_head_response:
            await self._stream(scope, receive, send)
            return
        if not self._slots.take():
            await self._busy()(scope, receive, send)
            return
        metrics.DOWNLOADS.labels(via=self._via).inc()
        metrics.DOWNLOADS_IN_FLIGHT.inc()

        async def counted(message: Message) -> None:
            await send(message)
            # Counted once handed to the server: a client that goes away midway got only what was sent.
            if message["type"] == "http.response.body":
                metrics.DOWNLOAD_BYTES.inc(len(message.get("body", b"")))

        try:
            await self._stream(scope, receive, counted)
        finally:
            metrics.DOWNLOADS_IN_FLIGHT.dec()
            self._slots.release()
