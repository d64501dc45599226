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

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from litestar import Request
from litestar.response import Stream
from litestar.response.base import ASGIResponse
from litestar.types import Receive, Scope, Send

from space.errors import Busy, problem_for

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


OnStart = Callable[[], Awaitable[None]]
"""Called once a download holds its slot, before its first byte (the audit trail's `export.downloaded`)."""


class DownloadStream(Stream):
    """A result streamed to its client while it holds a download slot; 503 `busy` when none is free.

    `on_start` runs when the body is about to go out (never for HEAD, busy or a refusal); if it raises, nothing
    is sent but the error's answer: a download the audit trail could not record does not happen.
    """

    __slots__ = ("on_start", "slots")

    def __init__(
        self, content: AsyncIterator[bytes], *, slots: DownloadSlots, on_start: OnStart | None = None, **kwargs: Any
    ) -> None:
        super().__init__(content, **kwargs)
        self.slots = slots
        self.on_start = on_start

    def to_asgi_response(self, app: Any, request: Request[Any, Any, Any], **kwargs: Any) -> ASGIResponse:
        """The stream's ASGI response inside the slot guard."""
        stream = super().to_asgi_response(app, request, **kwargs)

        def busy() -> ASGIResponse:
            error = Busy(
                f"This server streams at most {self.slots.limit} downloads at once; try again shortly.",
                headers={"Retry-After": str(BUSY_RETRY_AFTER)},
            )
            return problem_for(error).to_asgi_response(None, request)

        return _InSlot(stream, self.slots, busy, self.on_start)


class _InSlot(ASGIResponse):
    """Sends `stream` while holding a slot, or the busy answer; an ASGIResponse only so Litestar can send it."""

    __slots__ = ("_busy", "_on_start", "_slots", "_stream")

    def __init__(
        self,
        stream: ASGIResponse,
        slots: DownloadSlots,
        busy: Callable[[], ASGIResponse],
        on_start: OnStart | None = None,
    ) -> None:
        super().__init__(status_code=stream.status_code)
        self._stream = stream
        self._slots = slots
        self._busy = busy
        self._on_start = on_start

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # A HEAD response streams nothing, so it takes no slot.
        if self._stream.is_head_response:
            await self._stream(scope, receive, send)
            return
        if not self._slots.take():
            await self._busy()(scope, receive, send)
            return
        try:
            if self._on_start is not None:
                await self._on_start()
            await self._stream(scope, receive, send)
        finally:
            self._slots.release()
