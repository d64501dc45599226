"""The floor of the link-download case: a bare Litestar app that serves one file from memory, whole or as one
byte range, with no authentication, no database and no middleware.

The bench downloads it exactly as it downloads an export (the same client, ranges and rounds), so its ratios say
what this stack, this client and this machine allow before Space does anything per request (SPEC §6's
authorization, the audit row, the chunk reads). Served by uvicorn with httptools, as `space api` is:

    SPACE_BENCH_FLOOR_FILE=<file> uvicorn benchmarks.floor:app --http httptools
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

from litestar import Litestar, Request, get
from litestar.response import Stream

from space.exports.storage.protocol import READ_PIECE_BYTES

_BODY = memoryview(Path(os.environ["SPACE_BENCH_FLOOR_FILE"]).read_bytes())


@get("/file")
async def whole_or_range(request: Request[None, None, None]) -> Stream:
    """The file, or the one range `bytes=a-b` of it (206), in pieces of the API's size."""
    start, end, status = 0, len(_BODY), 200
    if asked := request.headers.get("range"):
        first, _, last = asked.removeprefix("bytes=").partition("-")
        start, end, status = int(first), int(last) + 1, 206

    async def pieces() -> AsyncIterator[bytes]:
        for at in range(start, end, READ_PIECE_BYTES):
            yield bytes(_BODY[at : min(end, at + READ_PIECE_BYTES)])

    return Stream(pieces(), status_code=status, headers={"Content-Length": str(end - start)}, media_type="text/csv")


app = Litestar([whole_or_range])
