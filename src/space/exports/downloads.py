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

import asyncio
import functools
import re
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl

from litestar import Request, Response
from litestar.response import Redirect, Stream
from litestar.response.base import ASGIResponse
from litestar.response.streaming import ASGIStreamingResponse
from litestar.types import ASGIApp, HTTPResponseBodyEvent, Message, Receive, Scope, Send

from space.errors import Busy, RangeNotSatisfiable
from space.exports.storage.protocol import Opening, ResultKey, ResultStore, opens

if TYPE_CHECKING:
    from space.exports.service import Download
from space.observability import metrics
from space.problems import problem_for

BUSY_RETRY_AFTER = 5
"""Seconds a client is asked to wait when every download slot of the process is taken."""
REDIRECT_HEADERS = {"Cache-Control": "private, no-store", "Referrer-Policy": "no-referrer"}
"""A 303 to a presigned URL: neither it nor its Location may be kept by a cache or sent on as a Referer."""


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


@dataclass(frozen=True)
class ByteRange:
    """Bytes `start` to `end` (exclusive) of a result."""

    start: int
    end: int


# One range of RFC 9110 §14.1.2: `a-b`, `a-` or `-n`. Several ranges (a comma) never match: they get the whole
# body, which the RFC allows and which spares a multipart body. 19 digits keep every number inside bigint.
_ONE_RANGE = re.compile(r"bytes=(\d{0,19})-(\d{0,19})", re.ASCII | re.IGNORECASE)


def requested_range(range_header: str | None, if_range: str | None, etag: str, size: int) -> ByteRange | None:
    """The one range a request asks for, or None for the whole body (no, several or malformed ranges, or an
    `If-Range` that is not the current ETag); RangeNotSatisfiable when it lies past the result's end."""
    if range_header is None or (if_range is not None and if_range.strip() != etag):
        return None
    m = _ONE_RANGE.fullmatch(range_header.strip())
    if m is None or m.groups() == ("", ""):
        return None
    first, last = m.groups()
    if first and last and int(last) < int(first):
        return None  # not a range at all (RFC 9110: an invalid range-spec is ignored)
    if not first:
        start, end = max(0, size - int(last)), size
        satisfiable = int(last) > 0 and size > 0
    else:
        start = int(first)
        end = min(int(last) + 1, size) if last else size
        satisfiable = start < size
    if not satisfiable:
        raise RangeNotSatisfiable(
            f"The result has {size} bytes.", headers={"Content-Range": f"bytes */{size}", "Accept-Ranges": "bytes"}
        )
    return ByteRange(start, end)


def first_part(store: ResultStore, key: ResultKey, request: Request[Any, Any, Any]) -> Opening | None:
    """The first part of the one closed range (`bytes=a-b`) a GET asks for, as the store's statement, for the
    authorization's round trip to fetch; None for anything else (no range, an open or suffix one, a conditional
    request), which reads its first part as every later one, once authorized."""
    headers = request.headers
    if request.method != "GET" or "if-range" in headers or "if-none-match" in headers or not opens(store):
        return None
    m = _ONE_RANGE.fullmatch((headers.get("range") or "").strip())
    if m is None or not m.group(1) or not m.group(2) or int(m.group(2)) < int(m.group(1)):
        return None
    return store.opening(key, int(m.group(1)), int(m.group(2)) + 1)


def not_modified(if_none_match: str | None, etag: str) -> bool:
    """Whether `If-None-Match` names the current ETag (weak comparison, RFC 9110 §13.1.2), or is `*`."""
    if if_none_match is None:
        return False
    tags = [t.strip() for t in if_none_match.split(",")]
    return any(t == "*" or t.removeprefix("W/") == etag for t in tags)


Recorder = Callable[[str | None, int | None, bool], Awaitable[None]]
"""Records a download as it starts, given the range asked for (`bytes=a-b`, or None for the whole), the bytes the
API sends (None when it hands the download to the store: what the store sends is not known here) and whether it
was handed over (a 303)."""


async def respond(
    download: Download,
    request: Request[Any, Any, Any],
    slots: DownloadSlots,
    record: Recorder | None = None,
    *,
    redirect: str | None = None,
) -> Response[Any]:
    """The answer to an authorized GET or HEAD of a result: 304, 206, 200, a 303 to `redirect` when the object
    store serves the bytes (SPEC §15), or RangeNotSatisfiable.

    Runs only after SPEC §6's authorization, so no conditional or range answer ever bypasses it. A range is
    read from the store as it is (an offset is a chunk number and a position in it): only the parts it covers.
    """
    etag = f'"{download.sha256}"'
    headers: dict[str, str] = {
        "Content-Disposition": f'attachment; filename="{download.filename}"',
        "Cache-Control": "private, no-store",
        "X-Content-Type-Options": "nosniff",
        "ETag": etag,
        "Accept-Ranges": "bytes",
    }
    if not_modified(request.headers.get("if-none-match"), etag):
        return Response(content=None, status_code=304, headers=headers)
    size = download.byte_size
    part = requested_range(request.headers.get("range"), request.headers.get("if-range"), etag, size)
    start, end, status = (0, size, 200) if part is None else (part.start, part.end, 206)
    if part is not None:
        headers["Content-Range"] = f"bytes {start}-{end - 1}/{size}"
    served = None if part is None else f"bytes={start}-{end - 1}"
    # HEAD is answered here even when the store serves the bytes: a 303 would send the client to a presigned GET
    # of the whole file, which a HEAD never asked for (and the trail would not see).
    if redirect is not None and request.method != "HEAD":
        # The store answers the range itself, and its URL serves whatever range its holder asks: the trail records
        # the hand-over as it happens, with the range asked for and no byte count (a `bytes=0-0` is not 1 byte).
        if record is not None:
            await record(served, None, True)
        metrics.DOWNLOADS.labels(via=download.via).inc()
        return Redirect(redirect, status_code=303, headers={**REDIRECT_HEADERS, "ETag": etag})
    headers["Content-Length"] = str(end - start)
    # Litestar leaves Content-Type out of a HEAD response; SPEC §11 wants GET's headers, so it is set here.
    headers["Content-Type"] = download.content_type
    body = _nothing() if request.method == "HEAD" else download.body(start, end)
    on_start = None if record is None else functools.partial(record, served, end - start, False)
    return DownloadStream(
        body,
        slots=slots,
        on_start=on_start,
        via=download.via,
        media_type=download.content_type,
        headers=headers,
        status_code=status,
    )


async def _nothing() -> AsyncIterator[bytes]:
    return
    yield b""  # pragma: no cover - makes this an async generator


def no_referrer_for_links(app: ASGIApp) -> ASGIApp:
    """Middleware: every answer to a request with a `token=` carries `Referrer-Policy: no-referrer` (SPEC §10),
    so a page the browser goes on to never learns the link."""

    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        query = scope.get("query_string", b"").decode("latin-1")
        if not any(name == "token" for name, _ in parse_qsl(query, keep_blank_values=True)):
            await app(scope, receive, send)
            return

        async def send_no_referrer(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                if not any(name.lower() == b"referrer-policy" for name, _ in headers):
                    headers.append((b"referrer-policy", b"no-referrer"))
                message["headers"] = headers
            await send(message)

        await app(scope, receive, send_no_referrer)

    return middleware


class DownloadStream(Stream):
    """A result streamed to its client while it holds a download slot; 503 `busy` when none is free.

    `on_start` runs when the body is about to go out (never for HEAD, busy or a refusal); if it raises, nothing
    is sent but the error's answer: a download the audit trail could not record does not happen.
    """

    __slots__ = ("on_start", "slots", "via")

    def __init__(
        self,
        content: AsyncIterator[bytes],
        *,
        slots: DownloadSlots,
        on_start: OnStart | None = None,
        via: str = "bearer",
        **kwargs: Any,
    ) -> None:
        super().__init__(content, **kwargs)
        self.slots = slots
        self.on_start = on_start
        self.via = via
        """How the download was authorized (`bearer` or `link`): the label of `space_downloads_total`."""

    def to_asgi_response(self, app: Any, request: Request[Any, Any, Any], **kwargs: Any) -> ASGIResponse:
        """The stream's ASGI response inside the slot guard (bodiless for HEAD: Litestar doesn't decide that)."""
        kwargs["is_head_response"] = request.method == "HEAD"
        stream = super().to_asgi_response(app, request, **kwargs)

        def busy() -> ASGIResponse:
            error = Busy(
                f"This server streams at most {self.slots.limit} downloads at once; try again shortly.",
                headers={"Retry-After": str(BUSY_RETRY_AFTER)},
            )
            return problem_for(error).to_asgi_response(None, request)

        assert isinstance(stream, ASGIStreamingResponse)
        return _InSlot(stream, self.slots, busy, self.on_start, self.via)


class _InSlot(ASGIResponse):
    """Sends `stream` while holding a slot, or the busy answer; an ASGIResponse only so Litestar can send it."""

    __slots__ = ("_busy", "_on_start", "_slots", "_stream", "_via")

    def __init__(
        self,
        stream: ASGIStreamingResponse,
        slots: DownloadSlots,
        busy: Callable[[], ASGIResponse],
        on_start: OnStart | None = None,
        via: str = "bearer",
    ) -> None:
        super().__init__(status_code=stream.status_code)
        self._stream = stream
        self._slots = slots
        self._busy = busy
        self._on_start = on_start
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
            if self._on_start is not None:
                await self._on_start()
            await self._stream.start_response(counted)
            await _send_body(self._stream, receive, counted)
        finally:
            metrics.DOWNLOADS_IN_FLIGHT.dec()
            self._slots.release()


async def _send_body(stream: ASGIStreamingResponse, receive: Receive, send: Send) -> None:
    """Send the stream's pieces as the body, until its end or until the client is gone.

    Litestar's own streaming runs the body in an anyio task group beside a task that waits for the disconnect; here
    one plain task waits for it and the body is sent by the request's own task, which looks between two pieces
    whether the client went away (a send to a gone client returns quietly, and one blocked on a stalled client
    returns when the connection drops). The store's read in flight then ends its query (`storage.postgres`), and no
    further part is read.
    """

    async def gone() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    listener = asyncio.ensure_future(gone())
    body = stream.iterator
    try:
        async for piece in body:
            if listener.done():
                return
            event: HTTPResponseBodyEvent = {
                "type": "http.response.body",
                "body": piece if isinstance(piece, bytes) else piece.encode(),
                "more_body": True,
            }
            await send(event)
        end: HTTPResponseBodyEvent = {"type": "http.response.body", "body": b"", "more_body": False}
        await send(end)
    finally:
        listener.cancel()
        if isinstance(body, AsyncGenerator):
            await body.aclose()
