"""Opaque `before` cursors of keyset-paged lists: a version and the last row's id, nothing else (no counts, no
positions). No HTTP framework here: the worker's modules import it too."""

from __future__ import annotations

import base64
import binascii
import uuid

import msgspec


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
