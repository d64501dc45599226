"""The page query parameters of paginated lists, for route signatures (Litestar's parameter constraints)."""

from __future__ import annotations

import base64
import binascii
import uuid
from typing import Annotated

import msgspec
from litestar.params import QueryParameter

MAX_PAGE_SIZE = 200
DEFAULT_PAGE_SIZE = 50
# Keeps OFFSET = (page - 1) * pageSize far inside bigint, whatever the caller sends.
MAX_PAGE = 1_000_000

PageNumber = Annotated[int, QueryParameter(ge=1, le=MAX_PAGE)]
"""The `page` query parameter of a paginated list (from 1)."""
PageSize = Annotated[int, QueryParameter(ge=1, le=MAX_PAGE_SIZE)]
"""The `pageSize` query parameter of a paginated list."""


def encode_cursor(row_id: uuid.UUID, version: int) -> str:
    """An opaque `before` cursor naming the last row a page showed (and nothing else: no counts, no positions)."""
    raw = msgspec.json.encode([version, str(row_id)])
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def decode_cursor(cursor: str, version: int) -> uuid.UUID | None:
    """The row a cursor of `version` names; None for anything such a list did not make."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        found, row_id = msgspec.json.decode(raw, type=tuple[int, uuid.UUID])
    except (binascii.Error, ValueError, msgspec.DecodeError, msgspec.ValidationError):
        return None
    return row_id if found == version else None
